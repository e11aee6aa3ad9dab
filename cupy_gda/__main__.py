"""``python -m cupy_gda``: the same as the ``cupy-gda`` command."""
from cupy_gda.cli import main

if __name__ == "__main__":
    main(prog_name="cupy-gda")
