"""The agent's local tools, each confined to its episode workspace.

bash runs in the OS sandbox's "shell" profile (sandbox_workers/ossandbox.py:
only the workspace visible read-write at its own path, toolchain and Python
read-only, private capped /tmp, no network, own PID namespace and user), with
resource limits, a deadline (the sandbox and all in it are killed) and truncated
output; with isolation="none" (trusted use only) a fresh session without network
(`unshare -rn`). File tools resolve every path inside the workspace and refuse
escapes and protected files. Every failure is returned as text for the model,
never raised.
"""
from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import re
import resource
import shutil
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from sandbox_workers import ossandbox
from sandbox_workers.isolation import Limits

MAX_READ_LINES = 2000


@dataclass
class ToolResult:
    output: str
    ok: bool = True
    finish: bool = False


class ToolError(Exception):
    """A tool was used wrongly; the message goes back to the model."""


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters truncated] ...\n{text[-half:]}"


def _sandbox_path() -> str:
    """PATH inside the shell sandbox: the project's Python first, then the system's (and nvcc's) directories."""
    dirs = [os.path.join(sys.prefix, "bin"), "/usr/local/bin", "/usr/bin", "/bin"]
    cuda = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    if os.path.isdir(os.path.join(cuda, "bin")):
        dirs.append(os.path.join(cuda, "bin"))
    return ":".join(dict.fromkeys(dirs))


def _sandbox_prefix() -> list[str]:
    """No network: a new user+net namespace when the kernel allows it."""
    return ["unshare", "-rn"] if shutil.which("unshare") and _unshare_works() else []


_UNSHARE_OK: bool | None = None


def _unshare_works() -> bool:
    global _UNSHARE_OK
    if _UNSHARE_OK is None:
        import subprocess
        try:
            _UNSHARE_OK = subprocess.run(["unshare", "-rn", "true"], capture_output=True,
                                         timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            _UNSHARE_OK = False
    return _UNSHARE_OK


class LocalTools:
    """bash / read / write / edit / multi_edit / glob / grep / todo_write for one workspace."""

    NAMES = frozenset({"bash", "read", "write", "edit", "multi_edit", "glob", "grep", "todo_write"})

    def __init__(self, workspace: Path, *, protected: set[str] = frozenset(), bash_timeout_s: float = 60.0,
                 max_output_chars: int = 8000, memory_limit_mb: int = 4096, isolation: str = "bwrap",
                 tmp_mb: int = 512):
        self.root = Path(workspace).resolve()
        self.isolation = isolation
        self.tmp_mb = tmp_mb
        self.protected = set(protected)
        self.bash_timeout_s = bash_timeout_s
        self.max_output_chars = max_output_chars
        self.memory_limit_mb = memory_limit_mb
        self.todos: list[dict] = []

    async def call(self, name: str, args: dict) -> ToolResult:
        try:
            fn = getattr(self, f"_t_{name}")
            return await fn(**args)
        except TypeError as exc:  # wrong or missing arguments
            return ToolResult(f"error: bad arguments for {name}: {exc}", ok=False)
        except ToolError as exc:
            return ToolResult(f"error: {exc}", ok=False)
        except OSError as exc:
            return ToolResult(f"error: {name}: {exc.strerror or exc}", ok=False)

    # -- paths ----------------------------------------------------------------
    def path(self, rel: str, *, for_write: bool = False) -> Path:
        if not isinstance(rel, str) or not rel:
            raise ToolError("path must be a non-empty string")
        p = (self.root / rel).resolve()
        if p != self.root and self.root not in p.parents:
            raise ToolError(f"path {rel!r} is outside the workspace")
        relp = p.relative_to(self.root).as_posix()
        if for_write and any(relp == q or relp.startswith(q.rstrip("/") + "/") for q in self.protected):
            raise ToolError(f"{relp} is read-only")
        return p

    # -- tools ----------------------------------------------------------------
    async def _t_bash(self, command: str, timeout_s: float | None = None) -> ToolResult:
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command must be a non-empty string")
        deadline = min(float(timeout_s or self.bash_timeout_s), self.bash_timeout_s)
        try:
            boxed = ossandbox.mode(self.isolation) == "bwrap"
        except ossandbox.IsolationUnavailable as exc:  # fail closed: no shell without the sandbox
            return ToolResult(f"error: bash is unavailable: {exc}", ok=False)
        mem = self.memory_limit_mb * 1024 * 1024

        def limits() -> None:  # runs in the child before exec (isolation "none" only)
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, 256 << 20))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

        if boxed:
            env = {"PATH": _sandbox_path(), "HOME": str(self.root), "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
            ossandbox.prepare_dir(self.root)  # the sandbox user owns the workspace (as root)
            profile = ossandbox.Profile("shell", rw_binds=[(str(self.root), str(self.root))], chdir=str(self.root),
                                        tmp_mb=self.tmp_mb, toolchain=True)
            cmd = ossandbox.wrap(["bash", "-c", command], profile,
                                 Limits(wall_s=deadline, data_mb=self.memory_limit_mb, file_size_mb=256,
                                        open_files=4096), env)
            extra = {"env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, "cwd": "/"}
        else:
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root), "LANG": "C.UTF-8",
                   "TMPDIR": str(self.root)}
            cmd = [*_sandbox_prefix(), "bash", "-c", command]
            extra = {"env": env, "cwd": self.root, "preexec_fn": limits}
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, **extra)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), deadline)
        except asyncio.TimeoutError:
            _kill_group(proc.pid)
            await proc.wait()
            return ToolResult(f"error: command timed out after {deadline:g} s and was killed", ok=False)
        except asyncio.CancelledError:
            _kill_group(proc.pid)
            raise
        text = out.decode("utf-8", "replace")
        body = truncate(text, self.max_output_chars).rstrip("\n")
        return ToolResult(f"{body}\n[exit code {proc.returncode}]".lstrip("\n"), ok=proc.returncode == 0)

    async def _t_read(self, path: str, offset: int = 0, limit: int = MAX_READ_LINES) -> ToolResult:
        p = self.path(path)
        if not p.is_file():
            raise ToolError(f"{path}: no such file")
        lines = p.read_text(errors="replace").splitlines()
        offset, limit = max(0, int(offset)), max(1, min(int(limit), MAX_READ_LINES))
        chunk = lines[offset:offset + limit]
        body = "\n".join(f"{i + offset + 1:6d}\t{line}" for i, line in enumerate(chunk))
        if offset + limit < len(lines):
            body += f"\n... ({len(lines) - offset - limit} more lines; use offset)"
        return ToolResult(truncate(body, self.max_output_chars) or "(empty file)")

    async def _t_write(self, path: str, content: str) -> ToolResult:
        if not isinstance(content, str):
            raise ToolError("content must be a string")
        p = self.path(path, for_write=True)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        return ToolResult(f"wrote {len(content)} characters to {p.relative_to(self.root).as_posix()}")

    @staticmethod
    def _apply_edit(text: str, old: str, new: str, replace_all: bool, path: str) -> str:
        if not isinstance(old, str) or not isinstance(new, str) or old == "":
            raise ToolError("old_string and new_string must be strings and old_string non-empty")
        n = text.count(old)
        if n == 0:
            raise ToolError(f"{path}: old_string not found")
        if n > 1 and not replace_all:
            raise ToolError(f"{path}: old_string occurs {n} times; make it unique or set replace_all")
        return text.replace(old, new) if replace_all else text.replace(old, new, 1)

    async def _t_edit(self, path: str, old_string: str, new_string: str, replace_all: bool = False) -> ToolResult:
        p = self.path(path, for_write=True)
        if not p.is_file():
            raise ToolError(f"{path}: no such file")
        p.write_text(self._apply_edit(p.read_text(), old_string, new_string, bool(replace_all), path))
        return ToolResult(f"edited {path}")

    async def _t_multi_edit(self, path: str, edits: list) -> ToolResult:
        p = self.path(path, for_write=True)
        if not p.is_file():
            raise ToolError(f"{path}: no such file")
        if not isinstance(edits, list) or not edits:
            raise ToolError("edits must be a non-empty list of {old_string, new_string}")
        text = p.read_text()
        for i, e in enumerate(edits):  # all or nothing: the file is written once at the end
            if not isinstance(e, dict):
                raise ToolError(f"edits[{i}] must be an object")
            try:
                text = self._apply_edit(text, e.get("old_string"), e.get("new_string"),
                                        bool(e.get("replace_all", False)), path)
            except ToolError as exc:
                raise ToolError(f"edits[{i}]: {exc} (no edit applied)") from None
        p.write_text(text)
        return ToolResult(f"applied {len(edits)} edits to {path}")

    async def _t_glob(self, pattern: str, path: str = ".") -> ToolResult:
        base = self.path(path)
        hits = sorted(p.relative_to(self.root).as_posix() for p in base.glob(pattern)
                      if self.root in p.resolve().parents)
        return ToolResult("\n".join(hits[:500]) or "(no matches)")

    async def _t_grep(self, pattern: str, path: str = ".", glob: str = "*") -> ToolResult:
        try:
            rx = re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"bad regex: {exc}") from None
        base, out = self.path(path), []
        files = [base] if base.is_file() else sorted(f for f in base.rglob("*") if f.is_file())
        for f in files:
            rel = f.relative_to(self.root).as_posix()
            if not fnmatch.fnmatch(f.name, glob) or f.stat().st_size > 4 << 20:
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if rx.search(line):
                    out.append(f"{rel}:{n}:{line}")
                    if len(out) >= 500:
                        break
        return ToolResult(truncate("\n".join(out), self.max_output_chars) or "(no matches)")

    async def _t_todo_write(self, todos: list) -> ToolResult:
        if not isinstance(todos, list) or not all(isinstance(t, dict) and "content" in t for t in todos):
            raise ToolError('todos must be a list of {"content", "status"} objects')
        self.todos = [{"content": str(t["content"]), "status": str(t.get("status", "pending"))} for t in todos]
        return ToolResult(json.dumps(self.todos, indent=1))


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
