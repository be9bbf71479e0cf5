"""tests/run_command.py's ``run_script`` runs a user's Python file in-process as ``python <file> <args>`` runs it:
the same exit status and output, the file's folder importable, its ``__name__`` ``"__main__"``, and ``sys.path``
and ``sys.argv`` as they were afterwards."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.run_command import run_script

SCRIPT = '''
import os
import sys

import helper  # beside the script: importable because Python puts the script's folder first on sys.path

print("argv", sys.argv[1:], "name", __name__, "here", os.path.basename(os.getcwd()))
print(helper.GREETING, file=sys.stderr)
if "--fail" in sys.argv:
    raise SystemExit(f"{sys.argv[0]}: error: asked to fail")
sys.exit(int(sys.argv[1]))
'''


@pytest.mark.parametrize("args", [["0"], ["3"], ["0", "--fail"]])
def test_in_process_equals_python_running_the_file(tmp_path, args):
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "my_script.py").write_text(SCRIPT)
    (tmp_path / "tool" / "helper.py").write_text('GREETING = "hello from helper"\n')
    path_before, argv_before = list(sys.path), list(sys.argv)
    proc = subprocess.run([sys.executable, "tool/my_script.py", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    inner = run_script("tool/my_script.py", args, cwd=tmp_path)
    assert (inner.returncode, inner.stdout, inner.stderr) == (proc.returncode, proc.stdout, proc.stderr)
    assert inner.returncode == (1 if "--fail" in args else int(args[0]))
    assert sys.path == path_before and sys.argv == argv_before
    sys.modules.pop("helper", None)
