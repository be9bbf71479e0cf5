"""The suite as packages (``tests.<subpackage>.test_x``), mirroring ``dpr/``: pytest's default import mode then
names each module by its path, so two subdirectories may hold files of the same name, and a test imports a
helper of another file (or of conftest) as ``tests.<subpackage>.test_x`` whichever file runs first or alone."""
