#!/bin/sh
# Refreshes the console's vendored browser libraries from the npm registry (nothing is
# downloaded at run time): bump a version here, run `sh services/console/vendor.sh`, commit.
set -eu
cd "$(dirname "$0")/static/vendor"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
take() {  # take <package@version> <file in the package> <name here>
    (cd "$work" && npm pack --silent "$1" > /dev/null && tar -xzf ./*.tgz && rm ./*.tgz)
    cp "$work/package/$2" "$3"
    rm -rf "$work/package"
}
take cytoscape@3.35.0 dist/cytoscape.min.js cytoscape.min.js
take htmx.org@2.0.11 dist/htmx.min.js htmx.min.js
take htmx-ext-sse@2.2.4 dist/sse.min.js htmx-sse.min.js
take chart.js@4.6.1 dist/chart.umd.min.js chart.umd.min.js
