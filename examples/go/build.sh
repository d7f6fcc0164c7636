#!/usr/bin/env bash
# Generate the Go code of protos/ and build the dispo-go command and the ticket-worker
# example, with Go from Debian's packages only (no module proxy): GOPATH mode, the libraries
# under /usr/share/gocode.
#
#   examples/go/build.sh            # then examples/go/build/bin/dispo-go (and ticket-worker)
#
# Needs: golang-go golang-google-grpc-dev golang-google-protobuf-dev
# golang-github-golang-protobuf-1-5-dev protobuf-compiler protoc-gen-go protoc-gen-go-grpc.
# BUILD (default examples/go/build) holds the generated code, the binary and Go's build cache.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
protos=$(cd "$here/../../protos" && pwd)
build=${BUILD:-$here/build}
generated=$build/gopath/src

# The protos carry no go_package: each file's Go import path is given on protoc's line, one
# M option per file for both plugins. dispo/<context>/v1/x.proto -> dispo/gen/<context>/v1,
# package <context>v1. google/rpc/status.proto is the published one, so it maps to the
# published Go package instead of being generated again (two copies of google.rpc.Status
# would clash in the protobuf registry).
mapping=(Mgoogle/rpc/status.proto=google.golang.org/genproto/googleapis/rpc/status)
files=()
while IFS= read -r file; do
    folder=${file%/*}    # dispo/gateway/v1
    context=${folder#dispo/}
    context=${context%/v1} # gateway
    mapping+=("M$file=dispo/gen/$context/v1;${context}v1")
    files+=("$file")
done < <(cd "$protos" && find dispo -name '*.proto' | sort)
go_opts=() grpc_opts=()
for m in "${mapping[@]}"; do
    go_opts+=("--go_opt=$m")
    grpc_opts+=("--go-grpc_opt=$m")
done

rm -rf "$generated/dispo/gen"
mkdir -p "$generated" "$build/bin"
protoc -I "$protos" -I /usr/include \
    --go_out="$generated" --go_opt=paths=import "${go_opts[@]}" \
    --go-grpc_out="$generated" --go-grpc_opt=paths=import "${grpc_opts[@]}" \
    "${files[@]}"

# This folder's src/ (the dispo package and its commands), the generated code, Debian's Go
# libraries.
export GOPATH="$here:$build/gopath:/usr/share/gocode"
export GO111MODULE=off GOFLAGS= GOCACHE="${GOCACHE:-$build/cache}"
unformatted=$(gofmt -l "$here/src")
[ -z "$unformatted" ] || { echo "not gofmt-formatted: $unformatted" >&2; exit 1; }
go vet dispo dispo/cmd/dispo-go dispo/cmd/ticket-worker
go build -o "$build/bin/ticket-worker" dispo/cmd/ticket-worker
go build -o "$build/bin/dispo-go" dispo/cmd/dispo-go
echo "$build/bin/dispo-go"
