"""`python scripts/bench.py [options]` is `cupy-gda bench [options]`, also from a bare checkout."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from cupy_gda.cli import main  # noqa: E402

main(["bench", *sys.argv[1:]], prog_name="scripts/bench.py")
