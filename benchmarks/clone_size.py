"""What a reader downloads: the size of a full clone and of a shallow one (``git clone --depth 1``).

    python benchmarks/clone_size.py [--out benchmarks/results/clone-size]

Clones the repository's committed HEAD into a temporary folder twice, from its own git directory as a
remote would serve it (``--no-local``: packed, not hard-linked), and measures each on disk: ``.git`` and the
checked-out tree. Writes ``OUT/clone.json`` and ``OUT/clone.md``, which the README's clone line is made from.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def disk_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder``, links counted as links."""
    return sum(os.lstat(Path(base) / name).st_size for base, _, names in os.walk(folder) for name in names)


def clone(source: Path, target: Path, shallow: bool) -> dict[str, int]:
    """Clone ``source``'s HEAD into ``target``; its git directory's and its tree's bytes on disk."""
    depth = ["--depth", "1"] if shallow else []
    subprocess.run(["git", "clone", "--quiet", "--no-local", *depth, f"file://{source}", str(target)], check=True)
    git = disk_bytes(target / ".git")
    return {"git_bytes": git, "tree_bytes": disk_bytes(target) - git}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/clone-size")
    args = parser.parse_args(argv)
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as scratch:
        full = clone(REPO, Path(scratch) / "full", shallow=False)
        shallow = clone(REPO, Path(scratch) / "shallow", shallow=True)
    sizes = {"commit": head, "full": full, "shallow": shallow}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "clone.json").write_text(json.dumps(sizes, indent=2) + "\n")
    mb = {k: (v["git_bytes"] + v["tree_bytes"]) / 1e6 for k, v in sizes.items() if isinstance(v, dict)}
    lines = [
        "# What a clone weighs",
        "",
        f"At commit {head}, on disk (`.git` and the checked-out tree):",
        "",
        "| clone | `.git` | tree | total |",
        "|---|---|---|---|",
        *(
            f"| {'`git clone --depth 1`' if k == 'shallow' else '`git clone`'} | {sizes[k]['git_bytes'] / 1e6:.1f} MB "
            f"| {sizes[k]['tree_bytes'] / 1e6:.1f} MB | {mb[k]:.1f} MB |"
            for k in ("full", "shallow")
        ),
        "",
    ]
    (args.out / "clone.md").write_text("\n".join(lines))
    print(f"full clone {mb['full']:.1f} MB, shallow {mb['shallow']:.1f} MB (commit {head})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
