"""One episode's workspace: a fresh folder from the skills/ templates plus the task's model.py.

What the agent may change: ``model_new.py`` and ``kernels/`` (and scratch files
of its own). Template files outside those, and ``model.py``, are protected.
``solution_files()`` is what travels to the compile and evaluation workers.
"""
from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SKILLS_DIR = Path(__file__).resolve().parent.parent / "skills"
MODEL_PY = "model.py"
MODEL_NEW = "model_new.py"
KERNEL_DIR = "kernels"
SOURCE_SUFFIXES = (".cpp", ".cc", ".cu", ".h", ".hpp", ".cuh")
MAX_SOLUTION_BYTES = 2 * 1024 * 1024

_FALLBACK_SKILL = """# Task: write a faster ModelNew
`model.py` holds the reference PyTorch `Model`. Write `model_new.py` with a class `ModelNew`
(same constructor arguments as `Model`) whose forward calls your own kernels in `kernels/`.
Use the compile, verify and profile tools; call finish when done.
"""


def skill_text(backend: str, skills_dir: Path = SKILLS_DIR) -> str:
    """The SKILL.md the agent reads: per-backend if present, else the shared one."""
    for p in (skills_dir / "templates" / backend / "SKILL.md", skills_dir / backend / "SKILL.md",
              skills_dir / "SKILL.md"):
        if p.is_file():
            return p.read_text()
    return _FALLBACK_SKILL


def single_turn_skill_text(backend: str, skills_dir: Path = SKILLS_DIR) -> str:
    """The short instructions of single-turn mode (the whole solution in one reply): the backend's own,
    else a shared one, else the multi-turn SKILL.md."""
    for p in (skills_dir / "templates" / backend / "SKILL_single_turn.md", skills_dir / "SKILL_single_turn.md"):
        if p.is_file():
            return p.read_text()
    return skill_text(backend, skills_dir)


@dataclass
class Workspace:
    root: Path
    protected: set[str] = field(default_factory=set)
    initial_digest: str = ""  # digest of the template's solution files: "the agent changed nothing"

    @classmethod
    def create(cls, parent: Path, episode_id: str, model_py: str, backend: str,
               skills_dir: Path = SKILLS_DIR, starter: bool = True) -> "Workspace":
        """``starter=False`` (single-turn): no starter model_new.py / kernels, the reply is the solution."""
        parent.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=f"ep-{episode_id[:12]}-", dir=parent))
        protected = {MODEL_PY}
        template = skills_dir / "templates" / backend
        if template.is_dir():
            for src in sorted(template.rglob("*")):
                rel = src.relative_to(template).as_posix()
                solution = rel == MODEL_NEW or rel.startswith(KERNEL_DIR + "/")
                if src.is_dir() or "__pycache__" in rel or (solution and not starter):
                    continue
                dest = root / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
                if not solution:
                    protected.add(rel)
        for header in sorted((skills_dir / "infra").glob("*.h")):  # the fixed headers, shared by every backend
            shutil.copy2(header, root / header.name)
            protected.add(header.name)
        (root / KERNEL_DIR).mkdir(exist_ok=True)
        (root / MODEL_PY).write_text(model_py)
        ws = cls(root=root, protected=protected)
        ws.initial_digest = cls.digest(ws.solution_files())
        return ws

    def solution_files(self) -> dict[str, str]:
        """model_new.py and kernels/* sources: what the workers build and evaluate."""
        files: dict[str, str] = {}
        mn = self.root / MODEL_NEW
        if mn.is_file():
            files[MODEL_NEW] = mn.read_text(errors="replace")
        kdir = self.root / KERNEL_DIR
        if kdir.is_dir():
            for p in sorted(kdir.iterdir()):
                if p.is_file() and p.suffix in SOURCE_SUFFIXES:
                    files[f"{KERNEL_DIR}/{p.name}"] = p.read_text(errors="replace")
        return files

    def write_files(self, files: dict[str, str]) -> list[str]:
        """Write extracted solution files (single-turn mode); refuses paths outside the workspace."""
        written = []
        for rel, text in files.items():
            dest = (self.root / rel).resolve()
            if self.root.resolve() not in dest.parents or rel in self.protected:
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
            written.append(rel)
        return written

    @staticmethod
    def digest(files: dict[str, str]) -> str:
        h = hashlib.sha256()
        for k in sorted(files):
            h.update(k.encode() + b"\0" + files[k].encode() + b"\0")
        return h.hexdigest()

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
