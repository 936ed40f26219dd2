"""Coverage-guided fuzzing with atheris (libFuzzer).

    python tests/fuzz/fuzz.py TARGET [libFuzzer options, corpus directories]
    python tests/fuzz/fuzz.py --each WORKDIR [libFuzzer options]

e.g. ``python tests/fuzz/fuzz.py frames -max_total_time=600 /tmp/new tests/fuzz/corpus/frames``.
A crash (an error outside the target's allowed ones) stops the run and
leaves the input in ``crash-*``.

``--each`` fuzzes every target in turn with the same options, from its
checked-in corpus, writing new inputs to ``WORKDIR/TARGET/``, crashes to
``WORKDIR/TARGET-crash-*`` and libFuzzer's output to ``WORKDIR/TARGET.log``.
Instrumenting the code takes longer than a short fuzzing run, so it is done
once and every target runs in a child forked from the instrumented process.
It prints one line per target and exits with 1 if any target failed.
"""

from __future__ import annotations

import os
import sys

import atheris

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

with atheris.instrument_imports(include=["ketten", "targets"]):
    import targets


def fuzz(name: str, argv: list[str]) -> None:
    """Fuzz ``name`` with libFuzzer arguments ``argv`` (does not return)."""

    def one_input(data: bytes) -> None:
        targets.run(name, data)

    atheris.Setup([sys.argv[0], *argv], one_input)
    atheris.Fuzz()


def fuzz_each(workdir: str, options: list[str]) -> int:
    failed = []
    for name in sorted(targets.TARGETS):
        found = os.path.join(workdir, name)
        os.makedirs(found, exist_ok=True)
        log = os.path.join(workdir, f"{name}.log")
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(out, 1)
                os.dup2(out, 2)
                fuzz(name, [*options, f"-artifact_prefix={found}-", found,
                            os.path.join(HERE, "corpus", name)])
            finally:
                os._exit(70)  # libFuzzer exits by itself; reaching here is a failure
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        print(f"{name}: {'ok' if code == 0 else f'FAILED (exit {code}, see {log})'}")
        if code != 0:
            failed.append(name)
    return 1 if failed else 0


def main() -> None:
    if sys.argv[1:2] == ["--each"]:
        if len(sys.argv) < 3:
            raise SystemExit("usage: fuzz.py --each WORKDIR [libFuzzer options]")
        raise SystemExit(fuzz_each(sys.argv[2], sys.argv[3:]))
    name = sys.argv[1]
    if name not in targets.TARGETS:
        raise SystemExit(f"unknown target {name!r}; known: {', '.join(targets.TARGETS)}")
    fuzz(name, sys.argv[2:])


if __name__ == "__main__":
    main()
