"""Every ADR is in one form (title, status) and in the index of docs/adr/README.md, which
.ci/adr_index.py writes."""

import importlib.util
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "adr"


def load_index_script():
    spec = importlib.util.spec_from_file_location("adr_index", ROOT / ".ci" / "adr_index.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


adr_index = load_index_script()


def test_every_adr_is_in_form_and_in_the_index(capsys):
    assert adr_index.main(["--check"]) == 0, capsys.readouterr().err
    index = (FOLDER / "README.md").read_text()
    files = sorted(p.name for p in FOLDER.glob("[0-9]*.md"))
    assert len(files) > 60
    assert all(f"]({name})" in index for name in files)


def test_the_check_names_an_adr_out_of_form_and_a_stale_index(tmp_path, capsys):
    folder = tmp_path / "adr"
    shutil.copytree(FOLDER, folder)
    (folder / "0999-no-status.md").write_text("# ADR-0999: No status\n\n## Context\n")
    (folder / "0998-old-title.md").write_text("# 0998 — Old title\n\n**Status**: accepted\n")
    (folder / "0997-superseded.md").write_text(
        "# ADR-0997: Superseded\n\n**Status**: superseded by ADR-0996 · **Context**: x\n"
    )
    (folder / "0995-amended.md").write_text(
        "# ADR-0995: Amended\n\n**Status**: accepted · **Amended by**: ADR-0997 (a\nwrapped reason)\n"
    )
    assert adr_index.main(["--check", "--folder", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "0999-no-status.md: no '**Status**: accepted'" in err
    assert "0998-old-title.md: the first line is not '# ADR-0998: <sentence>'" in err
    assert "0997-superseded.md: names ADR-0996, which does not exist" in err
    assert "README.md: stale" in err

    (folder / "0999-no-status.md").unlink()
    (folder / "0998-old-title.md").unlink()
    (folder / "0996-new.md").write_text("# ADR-0996: New\n\nStatus: Accepted · Context: y\n")
    assert adr_index.main(["--folder", str(folder)]) == 0
    assert adr_index.main(["--check", "--folder", str(folder)]) == 0
    new = (folder / "0996-new.md").read_text()
    assert new == "# ADR-0996: New\n\n**Status**: accepted · **Context**: y\n"
    index = (folder / "README.md").read_text()
    assert "| [0997](0997-superseded.md) | Superseded | superseded by ADR-0996 |" in index
    assert "| [0995](0995-amended.md) | Amended | accepted, amended by ADR-0997 |" in index
