"""The checked-in generated code is exactly what the protos produce."""

import shutil

from dispo.libs import protogen


def test_checked_in_stubs_match_the_protos():
    assert protogen.check() == [], "run: python -m dispo.libs.protogen"


def test_drift_is_detected(tmp_path):
    stale = tmp_path / "api"
    shutil.copytree(protogen.API_DIR, stale, ignore=shutil.ignore_patterns("__pycache__"))
    module = stale / "common" / "v1" / "common_pb2.py"
    module.write_text(module.read_text() + "\n# edited by hand\n")
    (stale / "common" / "v1" / "extra_pb2.py").write_text("")

    drift = protogen.check(stale)

    assert "libs/api/common/v1/common_pb2.py" in drift
    assert "libs/api/common/v1/extra_pb2.py" in drift


def test_generated_imports_point_into_the_api_package():
    for module in protogen.API_DIR.rglob("*_pb2*.py"):
        text = module.read_text()
        assert "from dispo.common" not in text and "import dispo.common" not in text, module
