"""Task directories: read, write and import sets of KernelBench-style task files.

Layout written by kernelrl: ``DIR/index.json`` plus ``DIR/<backend>/level<N>/<i>_<Name>.py``.
The index lists every task (id, name, file, backend, level, source, operators, filter
evidence). A folder without an index (a KernelBench checkout: ``level1/``, ``level2/``,
...) is read by scanning ``*.py`` files that define ``class Model`` and ``get_inputs``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
INDEX = "index.json"
INDEX_VERSION = 1


class DatasetError(Exception):
    retriable = False
    user_facing = True


@dataclass
class TaskEntry:
    task_id: str
    name: str
    file: str  # relative to the dataset folder
    backend: str = "cpu"
    level: int = 0
    source: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    model_py: str = ""  # filled when read

    def index_row(self) -> dict:
        return {"task_id": self.task_id, "name": self.name, "file": self.file, "backend": self.backend,
                "level": self.level, "source": self.source, "metadata": self.metadata}

    def to_message(self):
        from schemas.messages import Task

        return Task(task_id=self.task_id, model_py=self.model_py, backend=self.backend, level=self.level,
                    name=self.name, source=self.source, metadata=dict(self.metadata))


def content_id(source: str, prefix: str = "synth") -> str:
    return f"{prefix}-{hashlib.sha256(source.encode()).hexdigest()[:12]}"


def is_task_source(text: str) -> bool:
    return "class Model" in text and "def get_inputs" in text and "def get_init_inputs" in text


def _level_of(path: Path) -> int:
    for part in reversed(path.parts):
        m = re.fullmatch(r"level_?(\d+)", part)
        if m:
            return int(m.group(1))
    return 0


def load_tasks(folder: str | os.PathLike, backend: str | None = None, level: int | None = None,
               default_backend: str = "cuda", include_rejected: bool = False) -> list[TaskEntry]:
    """Every task in a folder (through its index when there is one), optionally one backend/level only.

    Tasks that `kernelrl tasks verify --write` rejected (``metadata.rejected``: constant output, runtime
    out of the window on the real device, ...) are left out unless ``include_rejected``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetError(f"task folder {str(folder)!r} does not exist")
    index = folder / INDEX
    if index.is_file():
        entries = _from_index(folder, index)
    else:
        entries = _scan(folder, default_backend)
    out = [e for e in entries if (backend in (None, "all") or e.backend == backend)
           and (level is None or e.level == level)]
    rejected = [] if include_rejected else [e for e in out if e.metadata.get("rejected")]
    if rejected:
        log.info("%d task(s) in %s left out: rejected by `tasks verify` (%s)", len(rejected), folder,
                 ", ".join(sorted({e.metadata["rejected"].get("rule", "?") for e in rejected})))
        out = [e for e in out if not e.metadata.get("rejected")]
    if not out:
        what = f" for backend {backend!r}" if backend not in (None, "all") else ""
        why = (f" ({len(rejected)} rejected by `tasks verify` are left out; `kernelrl tasks list` shows them)"
               if rejected else "")
        raise DatasetError(f"no tasks{what} in {str(folder)!r}{why}")
    return out


def _from_index(folder: Path, index: Path) -> list[TaskEntry]:
    try:
        doc = json.loads(index.read_text())
    except ValueError as exc:
        raise DatasetError(f"{index}: not valid JSON ({exc})") from None
    if doc.get("version") != INDEX_VERSION or not isinstance(doc.get("tasks"), list):
        raise DatasetError(f"{index}: expected {{'version': {INDEX_VERSION}, 'tasks': [...]}}")
    entries = []
    for row in doc["tasks"]:
        path = folder / row["file"]
        if not path.is_file():
            raise DatasetError(f"{index}: task {row.get('task_id')!r} names a missing file {row['file']!r}")
        entries.append(TaskEntry(task_id=row["task_id"], name=row["name"], file=row["file"],
                                 backend=row.get("backend", "cpu"), level=int(row.get("level", 0)),
                                 source=row.get("source", ""), metadata=row.get("metadata", {}),
                                 model_py=path.read_text()))
    return entries


def _scan(folder: Path, default_backend: str) -> list[TaskEntry]:
    entries = []
    for path in sorted(folder.rglob("*.py"), key=lambda p: (str(p.parent), _numeric_key(p.stem))):
        text = path.read_text()
        if not is_task_source(text):
            continue
        rel = path.relative_to(folder)
        backend = next((b for b in ("cpu", "cuda") if b in rel.parts[:-1]), default_backend)
        level = _level_of(rel)
        entries.append(TaskEntry(task_id=f"l{level}-{path.stem}" if level else path.stem, name=path.stem,
                                 file=str(rel), backend=backend, level=level, source=folder.name,
                                 model_py=text))
    return entries


def _numeric_key(stem: str):
    m = re.match(r"(\d+)_", stem)
    return (int(m.group(1)) if m else 1 << 30, stem)


def write_index(folder: Path, entries: list[TaskEntry], meta: dict | None = None, merge: bool = True) -> Path:
    """Write (or merge into) DIR/index.json; entries with the same task_id are replaced."""
    index = folder / INDEX
    rows: dict[str, dict] = {}
    doc_meta = dict(meta or {})
    if merge and index.is_file():
        old = json.loads(index.read_text())
        rows = {r["task_id"]: r for r in old.get("tasks", [])}
        doc_meta = {**old.get("meta", {}), **doc_meta}
    for e in entries:
        rows[e.task_id] = e.index_row()
    ordered = sorted(rows.values(), key=lambda r: (r["backend"], r["level"], _numeric_key(Path(r["file"]).stem)))
    index.write_text(json.dumps({"version": INDEX_VERSION, "meta": doc_meta, "tasks": ordered}, indent=1) + "\n")
    return index


def next_number(folder: Path) -> int:
    nums = [_numeric_key(p.stem)[0] for p in folder.glob("*.py")]
    return max([n for n in nums if n < 1 << 30], default=0) + 1


def write_task(out: Path, entry: TaskEntry, number: int) -> TaskEntry:
    """Write one task file under out/<backend>/level<N>/ and fill entry.file."""
    sub = out / entry.backend / f"level{entry.level}"
    sub.mkdir(parents=True, exist_ok=True)
    path = sub / f"{number}_{entry.name}.py"
    path.write_text(entry.model_py)
    entry.file = str(path.relative_to(out))
    return entry


def import_dir(src: str | os.PathLike, out: str | os.PathLike, backend: str = "cuda",
               levels: list[int] | None = None) -> list[TaskEntry]:
    """Copy a folder of task files (e.g. a KernelBench checkout) into a kernelrl task folder."""
    src, out = Path(src), Path(out)
    if src.resolve() == out.resolve():
        raise DatasetError("import: the output folder must differ from the source folder")
    entries = _scan(src, backend)
    if levels:
        entries = [e for e in entries if e.level in levels]
    if not entries:
        raise DatasetError(f"no task files (class Model, get_inputs, get_init_inputs) under {str(src)!r}")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for e in entries:
        stem = Path(e.file).stem
        m = re.match(r"(\d+)_(.*)", stem)
        number, name = (int(m.group(1)), m.group(2)) if m else (next_number(out / backend / f"level{e.level}"), stem)
        e.backend, e.name, e.source = backend, name, f"import:{src.name}"
        e.task_id = f"{src.name.lower()}-l{e.level}-{number}"
        written.append(write_task(out, e, number))
    write_index(out, written, meta={"imported_from": str(src)})
    log.info("imported %d tasks from %s into %s", len(written), src, out)
    return written
