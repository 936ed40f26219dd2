"""Coverage-guided fuzzing of one target with atheris (libFuzzer).

    python tests/fuzz/fuzz.py TARGET [libFuzzer options, corpus directories]

e.g. ``python tests/fuzz/fuzz.py frames -max_total_time=600 /tmp/new tests/fuzz/corpus/frames``.
A crash (an error outside the target's allowed ones) stops the run and
leaves the input in ``crash-*``.
"""

from __future__ import annotations

import os
import sys

import atheris

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

with atheris.instrument_imports(include=["ketten", "targets"]):
    import targets


def main() -> None:
    name = sys.argv[1]
    if name not in targets.TARGETS:
        raise SystemExit(f"unknown target {name!r}; known: {', '.join(targets.TARGETS)}")

    def one_input(data: bytes) -> None:
        targets.run(name, data)

    atheris.Setup([sys.argv[0], *sys.argv[2:]], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
