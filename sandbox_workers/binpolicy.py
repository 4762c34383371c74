"""Judge the built kernel library by what the binary does: what it calls, runs at load, keeps and executes.

Source rules (guards.check_cpp) are a speed bump: token pasting, ``#include MACRO``, hand-written
declarations and asm get past any text rule. This policy reads the ELF file the builder produced:
- undefined dynamic symbols against a per-backend allow-list, default deny (``check_symbols``); DT_NEEDED;
- load-time code: each .init_array/.fini_array target is the toolchain's or a registration function
  (KRL_OP's static initialiser, nvcc's __sti____cudaRegisterAll) calling only the registry / CUDA
  registration API and writing only registry data; no IFUNC resolvers, nothing added to .init/.fini;
- writable global state: each object in a writable non-RELRO section is the toolchain's, the registry's
  (touched by registration code only), nvcc's launch bookkeeping, or an 8-byte library handle written only
  by its create call; no unnamed writable data, TLS or custom sections;
- raw system calls: syscall/sysenter/int $0x80 (x86-64), svc (aarch64) in any executable section.
Left to a process-level filter (seccomp): reaching libc by pointer arithmetic from an allowed symbol,
jumps into the middle of an instruction. ``__device__`` globals have a host shadow in .bss (refused here);
a device buffer keyed by pointer and reached otherwise is caught at run time by fresh inputs, not here.
"""
from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_workers import binpolicy_torch
from sandbox_workers.guards import (FORBIDDEN_SYMBOL, MUTABLE_GLOBAL_STATE, RAW_SYSCALL, STATIC_CONSTRUCTOR,
                                    Violation)

log = logging.getLogger(__name__)

POLICY_VERSION = 1  # part of the artifact cache key: bump when the policy tightens

_MATH = (r"(a?(sin|cos|tan)h?|atan2|exp|exp2|exp10|expm1|log|log2|log10|log1p|logb|pow|sqrt|cbrt|hypot|erfc?|"
         r"tgamma|lgamma|fabs|floor|ceil|trunc|l?l?round|l?l?rint|nearbyint|fmod|remainder|remquo|modf|frexp|"
         r"ldexp|scalbl?n|ilogb|copysign|nextafter|nexttoward|fdim|fmax|fmin|fma|sincos|nan)[fl]?")
_COMMON = [  # both backends: libm, pure libgcc helpers, a few libc memory functions, the C++ runtime
    rf"(__)?{_MATH}(_finite)?", rf"_ZGV[b-e][NM]\d+[a-z0-9]*_{_MATH}",  # libm, its _finite and libmvec forms
    r"__(mul|div)[sdxt]c3|__pow[sdx]i2|__(popcount|clz|ctz|ffs|parity)[sdt]i2|__(extend|trunc)[a-z]{2}[a-z]{2}2|"
    r"__float(un)?[sdt]i[sdxthb]f|__fix(uns)?[sdxthb]f[sdt]i",
    r"mem(cpy|move|set|cmp|chr)|__mem(cpy|move|set)_chk|malloc|calloc|realloc|free|aligned_alloc|posix_memalign|"
    r"str(n?len|n?cmp)|abort|__assert_fail|__stack_chk_fail",
    r"__cxa_finalize|__gmon_start__|_ITM_(de)?registerTMCloneTable|__cxa_atexit|"
    r"__cxa_(guard_(acquire|release|abort)|throw|rethrow|allocate_exception|free_exception|begin_catch|"
    r"end_catch|pure_virtual|deleted_virtual|call_terminate|throw_bad_array_new_length|bad_cast|bad_typeid)|"
    r"__gxx_personality_v0|_Unwind_Resume",
    r"_Z(nw|na|dl|da)[mPv]\w*|_ZSt\d+__throw_\w+|_ZSt9terminatev|_ZSt21__glibcxx_assert_fail\w*|"
    r"_ZT[IVS](St|NSt|N10__cxxabiv1)\w+|_ZNSt\d+(bad_alloc|bad_array_new_length|exception|bad_cast)D[0-2]Ev",
]
_CUDA_RT = (  # stateless launch/memory/query API of the CUDA runtime on the stream it is given
    r"__cuda(RegisterFatBinary|RegisterFatBinaryEnd|RegisterFunction|RegisterVar|RegisterManagedVar|InitModule|"
    r"UnregisterFatBinary|PushCallConfiguration|PopCallConfiguration|LaunchKernel|GetKernel|"
    r"RegisterLinkedBinary\w*)|cuda(LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|GetKernel)(_v\d+)?|"
    r"cuda(GetLastError|PeekAtLastError|GetErrorString|GetErrorName)|cuda(Memcpy|Memset|Memcpy2D|Memset2D)(Async)?|"
    r"cuda(FuncSetAttribute|FuncGetAttributes|FuncSetCacheConfig|GetDevice|GetDeviceCount|DeviceGetAttribute|"
    r"GetDeviceProperties(_v2)?|Occupancy\w+|StreamSynchronize|PointerGetAttributes|DriverGetVersion|"
    r"RuntimeGetVersion)|exit")  # exit: nvcc's host stub of a __device__ function calls exit(1)
_ALLOW = {"cpu": _COMMON + [r"GOMP_(?!target|offload)\w+|omp_(get_(?!wtime|wtick)\w+|set_num_threads|in_parallel|"
                            r"in_final)|__kmpc_\w+"],
          "cuda": _COMMON + [_CUDA_RT]}
_LIB_ALLOW = {"cublas": r"cublas(?!Xt|LoggerConfigure|SetLoggerCallback)\w+", "cublasLt": r"cublasLt(?!Logger)\w+",
              "cudnn": r"cudnn(?!SetCallback)\w+"}
_DENY = [  # explicit reasons for the usual suspects (everything not allowed is denied anyway)
    (r"syscall", RAW_SYSCALL, "raw system call"),
    (r"dl(open|mopen|sym|vsym|addr\d?|info|close|error|_iterate_phdr)|_dl_\w+", FORBIDDEN_SYMBOL,
     "dynamic loading / symbol lookup"),
    (r"(__)?(f?open|open(at)?|creat|fdopen|freopen|f?read|readv?|pread|f?write|writev|pwrite|close|lseek|f?printf|"
     r"puts|fputs|f?stat|lstat|access|unlink|rename|mkdir|opendir|readdir|readlink|getcwd|ioctl|fcntl)(64|_chk|"
     r"_2)?", FORBIDDEN_SYMBOL, "file or stream I/O"),
    (r"mmap|mmap64|munmap|mremap|mprotect|madvise|brk|sbrk|shm\w+|memfd_create", FORBIDDEN_SYMBOL, "memory mapping"),
    (r"socket|connect|bind|listen|accept4?|send\w*|recv\w*|getaddrinfo|gethostbyname\w*", FORBIDDEN_SYMBOL, "network"),
    (r"v?fork|clone3?|exec\w+|system|popen|posix_spawn\w*|kill|raise|signal|sigaction|ptrace|[gs]etenv|putenv|"
     r"prctl|_exit", FORBIDDEN_SYMBOL, "processes, signals or environment"),
    (r"pthread_\w+|thrd_\w+|_ZNSt6thread\w*", FORBIDDEN_SYMBOL, "threads: the OpenMP runtime is the only one allowed"),
    (r"clock_gettime|gettimeofday|time|clock|omp_get_wti(me|ck)|_ZNSt6chrono\w+", FORBIDDEN_SYMBOL, "timers"),
    (r"_?Py\w+", FORBIDDEN_SYMBOL, "Python C API"),
    (r"Sleef_\w+", FORBIDDEN_SYMBOL, "libtorch's SLEEF: no torch code in kernels"),
    (r"cuda(Stream|Event|Graph|Ipc|UserObject)\w*|cuda(HostAlloc|MallocHost|HostRegister|Malloc\w*|Free\w*|"
     r"MemcpyToSymbol\w*|MemcpyFromSymbol\w*|GetSymbolAddress|LaunchHostFunc|DeviceReset|SetDevice\w*|"
     r"DeviceSet\w+|DeviceSynchronize)", FORBIDDEN_SYMBOL,
     "CUDA state across calls, other streams/events/graphs, host callbacks or device-wide settings: allocate "
     "scratch with torch.empty in model_new.py and launch on the stream you are given"),
    (r"cuda(GetDriverEntryPoint\w*|GetProcAddress)|cu[A-Z]\w+", FORBIDDEN_SYMBOL, "the CUDA driver API"),
]
_TORCH_NS = re.compile(r"(^|[\s(<,*&])(torch|at|c10|caffe2|pybind11)::")
_NEEDED = {"cpu": r"lib(m|c|mvec|gomp|stdc\+\+|gcc_s)\.so\.\d+|ld-linux[\w.-]*\.so\.\d+",
           "cuda": r"lib(m|c|stdc\+\+|gcc_s|cudart)\.so\.\d+|ld-linux[\w.-]*\.so\.\d+"}
_REG_CALLEES = {"cpu": {"krl_register"},
                "cuda": {"krl_register", "__cudaRegisterFatBinary", "__cudaRegisterFatBinaryEnd",
                         "__cudaRegisterFunction", "__cudaRegisterVar", "__cudaInitModule", "atexit", "__cxa_atexit"}}
_HELPERS = re.compile(r"_Z\d+__static_initialization_and_destruction_\d+ii|_ZL\d+__nv_cudaEntityRegisterCallbackPPv")
_REG_FUNC = re.compile(r"_GLOBAL__sub_I_[\w.$-]+|_ZL24__sti____cudaRegisterAllv|" + _HELPERS.pattern)
_CRT_DATA = re.compile(r"_DYNAMIC|_GLOBAL_OFFSET_TABLE_|__TMC_END__|__dso_handle|completed\.\d+|DW\.ref\.__gxx_"
                       r"personality_v0|__(frame_dummy_init|do_global_dtors_aux_fini)_array_entry")
_REG_DATA = re.compile(r"_ZL\d+(krl_op_desc_|krl_op_reg_)\w+|_ZL17krl_registry_head|"  # the op registry's and
                       r"_ZL\d+__(cudaFatCubinHandle|fatDeviceText|nv_\w+)")  # nvcc's: written at load time
_NVCC_TMP = re.compile(r"_ZZ\d+__device_stub__\w+E5__tmp")
_CREATORS = {"cuda": {"__cudaGetKernel"}, "cublas": {"cublasCreate_v2"}, "cublasLt": {"cublasLtCreate"},
             "cudnn": {"cudnnCreate"}}
_CRT_UNIQUE = ("frame_dummy", "register_tm_clones", "deregister_tm_clones", "__do_global_dtors_aux", "completed.0",
               "__dso_handle", "atexit", "__TMC_END__", "__frame_dummy_init_array_entry", "_DYNAMIC",
               "__do_global_dtors_aux_fini_array_entry", "_GLOBAL_OFFSET_TABLE_")
_EXEC_OK = {".init", ".plt", ".plt.got", ".plt.sec", ".text", ".fini", ".iplt"}
_READ_ONLY_OPS = re.compile(r"(cmp|test|bt|push|call|jmp|ucomis|comis|prefetch|nop)[a-z]*$")


@dataclass
class Insn:  # one disassembled instruction; ref: rip-relative address from objdump's comment; target: branch symbol
    addr: int
    func: str
    mnem: str
    ops: str
    ref: int | None = None
    target: str = ""


@dataclass
class Elf:
    sections: list[tuple[str, int, int, str]] = field(default_factory=list)  # name, addr, size, flags
    relro: list[tuple[int, int]] = field(default_factory=list)
    objects: list[tuple[str, int, int, str]] = field(default_factory=list)  # name, addr, size, type
    funcs: dict[int, str] = field(default_factory=dict)
    names: dict[str, int] = field(default_factory=dict)  # symbol name -> count
    needed: list[str] = field(default_factory=list)
    align: dict[str, int] = field(default_factory=dict)  # section name -> sh_addralign
    relocs: list[tuple[int, str, str]] = field(default_factory=list)  # offset, type, symbol or addend
    insns: list[Insn] = field(default_factory=list)
    by_func: dict[str, list[Insn]] = field(default_factory=dict)
    aarch64: bool = False


def _tool(*args: str) -> str:
    res = subprocess.run(list(args), capture_output=True, text=True, timeout=120)
    if res.returncode:
        raise RuntimeError(f"{args[0]} failed: {res.stderr.strip()[:300]}")
    return res.stdout


def _demangle(names: list[str]) -> list[str]:
    try:
        dem = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return names
    return dem.splitlines() if len(dem.splitlines()) == len(names) else names


def check_symbols(undefined: list[str], backend: str, allowed_libs=(), torch_ext: bool = False) -> list[Violation]:
    """Undefined dynamic symbols (raw, optionally `name@VERSION`) against the backend's allow-list (and, for a
    torch extension, binpolicy_torch's rules first)."""
    allow = re.compile("|".join(f"(?:{p})" for p in _ALLOW[backend] + [_LIB_ALLOW[lib] for lib in allowed_libs
                                                                        if lib in _LIB_ALLOW]))
    raw = [u.split("@")[0] for u in undefined]
    found = []
    for sym, dem in zip(raw, _demangle(raw)):
        verdict = binpolicy_torch.classify(sym, dem, backend) if torch_ext else False
        if verdict is not False:
            found += [verdict] if verdict is not None else []
            continue
        if _TORCH_NS.search(dem) or re.match(r"_ZN\d*(5torch|2at|3c10|6caffe2|8pybind11)", sym):
            found.append(Violation(FORBIDDEN_SYMBOL, f"`{dem}`: torch/ATen/c10 code is not callable from kernels"))
            continue
        if allow.fullmatch(sym):
            continue
        name, why = FORBIDDEN_SYMBOL, "not on the allow-list"
        for pat, vname, reason in _DENY:
            if re.fullmatch(pat, sym):
                name, why = vname, reason
                break
        found.append(Violation(name, f"the library calls `{dem}` ({why}); kernels may call only libm math, a few "
                                     "memory functions, the C++ runtime and " + ("the CUDA launch/memory API (cuBLAS/"
                                     "cuDNN when linked)" if backend == "cuda" else "the OpenMP runtime")))
    return found


def _parse(path: Path) -> Elf:
    elf = Elf()
    elf.aarch64 = "AArch64" in _tool("readelf", "-hW", str(path))
    for m in re.finditer(r"^\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+[0-9a-f]+\s+"
                         r"([A-Za-z]*)\s+\d+\s+\d+\s+(\d+)$", _tool("readelf", "-SW", str(path)), re.M):
        elf.sections.append((m.group(1), int(m.group(2), 16), int(m.group(3), 16), m.group(4)))
        elf.align[m.group(1)] = max(1, int(m.group(5)))
    for m in re.finditer(r"^\s*GNU_RELRO\s+\S+\s+(0x[0-9a-f]+)\s+\S+\s+\S+\s+(0x[0-9a-f]+)",
                         _tool("readelf", "-lW", str(path)), re.M):
        elf.relro.append((int(m.group(1), 16), int(m.group(1), 16) + int(m.group(2), 16)))
    symtab = _tool("readelf", "-sW", str(path)).split("Symbol table '.symtab'")
    if len(symtab) < 2:
        raise RuntimeError("the library has no symbol table (stripped)")
    for m in re.finditer(r"^\s*\d+:\s+([0-9a-f]+)\s+(\d+|0x[0-9a-f]+)\s+(\w+)\s+\w+\s+\w+\s+(\w+)\s+(\S+)$",
                         symtab[1], re.M):
        addr, size, typ, ndx, name = int(m.group(1), 16), int(m.group(2), 0), m.group(3), m.group(4), m.group(5)
        elf.names[name] = elf.names.get(name, 0) + 1
        if typ in ("FUNC", "IFUNC") and ndx != "UND":
            elf.funcs.setdefault(addr, name)
        if typ in ("OBJECT", "TLS", "NOTYPE", "COMMON") and ndx not in ("UND", "ABS"):
            elf.objects.append((name, addr, size, typ))
        if typ == "IFUNC":
            elf.relocs.append((addr, "IFUNC", name))
    elf.needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _tool("readelf", "-dW", str(path)))
    for m in re.finditer(r"^([0-9a-f]+)\s+[0-9a-f]+\s+(R_\w+)\s+(.*)$", _tool("readelf", "-rW", str(path)), re.M):
        rest = m.group(3).split()  # "ADDEND" or "VALUE NAME + ADDEND"
        elf.relocs.append((int(m.group(1), 16), m.group(2), rest[-3] if len(rest) >= 3 else rest[-1]))
    func = ""
    for line in _tool("objdump", "-d", "-w", "--no-show-raw-insn", str(path)).splitlines():
        head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if head:
            func = head.group(1)
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*?)\s*$", line)
        if not m or not m.group(2):
            continue
        text, _, comment = m.group(2).partition("#" if not elf.aarch64 else "//")
        words = [w for w in text.split() if w not in ("bnd", "notrack", "lock", "rep", "repz", "repnz", "data16",
                                                      "cs", "ds", "addr32")]
        if not words:
            continue
        insn = Insn(int(m.group(1), 16), func, words[0], " ".join(words[1:]))
        ref = re.match(r"\s*([0-9a-f]+) <", comment)
        insn.ref = int(ref.group(1), 16) if ref else None
        tgt = re.fullmatch(r"[0-9a-f]+ <([^>]+)>", insn.ops)
        insn.target = tgt.group(1) if tgt else ""
        elf.insns.append(insn)
        elf.by_func.setdefault(func, []).append(insn)
    return elf


def _branch(elf: Elf, i: Insn) -> bool:
    if elf.aarch64:
        return i.mnem in ("b", "bl", "br", "blr", "cbz", "cbnz", "tbz", "tbnz") or i.mnem.startswith("b.")
    return i.mnem.startswith(("call", "j"))


def _is_store(elf: Elf, i: Insn) -> bool:
    return not elf.aarch64 and i.ops.endswith(")") and not _READ_ONLY_OPS.match(i.mnem)  # memory destination


def _callee(target: str) -> str:
    return re.sub(r"(@plt)?(\+0x[0-9a-f]+)?$", "", target)


def _check_registration(elf: Elf, func: str, backend: str, by_func: dict, data: dict, depth: int = 0) -> list[str]:
    """Why `func` is not a pure registration function (empty when it is)."""
    if not _REG_FUNC.fullmatch(func) or func not in by_func:
        return [f"`{_demangle([func])[0]}` runs at load time (a constructor or static initialiser of kernel code)"]
    why, last_rdi = [], ""
    for i in by_func[func]:
        if i.ref is not None and i.mnem.startswith("lea") and i.ops.endswith("%rdi"):
            last_rdi = data.get(i.ref) or elf.funcs.get(i.ref, "")
        if _is_store(elf, i) and not _REG_DATA.fullmatch(data.get(i.ref, "")) \
                and not re.fullmatch(r"%e[sd]i,-0x[0-9a-f]+\(%rbp\)", i.ops):  # -O0 spills its (int, int) args
            dest = _demangle([data.get(i.ref, hex(i.ref))])[0] if i.ref is not None else i.ops.split(",")[-1]
            why.append(f"`{_demangle([func])[0]}` writes `{dest}` at load time (a static object's constructor)")
        if not _branch(elf, i) or (i.target and _callee(i.target) == func):
            continue
        callee = _callee(i.target)
        if not i.target:
            why.append(f"`{_demangle([func])[0]}` makes an indirect call at load time")
        elif callee in ("atexit", "__cxa_atexit") and callee in _REG_CALLEES[backend] \
                and last_rdi != "_ZL26__cudaUnregisterBinaryUtilv":
            why.append(f"`{_demangle([func])[0]}` registers an exit handler other than nvcc's")
        elif callee in _REG_CALLEES[backend]:
            continue
        elif _HELPERS.fullmatch(callee) and depth < 2:
            why += _check_registration(elf, callee, backend, by_func, data, depth + 1)
        else:
            why.append(f"`{_demangle([func])[0]}` calls `{_demangle([callee])[0]}` at load time (a constructor or "
                       "static initialiser of kernel code)")
    return why


def _constructors(elf: Elf, backend: str, by_func: dict, data: dict) -> tuple[list[Violation], set[str]]:
    found, reg_funcs = [], set()
    secs = {s[0]: s for s in elf.sections}
    for sec, crt in ((".init_array", "frame_dummy"), (".fini_array", "__do_global_dtors_aux")):
        if sec not in secs:
            continue
        _, lo, size, _ = secs[sec]
        for off, rtype, val in elf.relocs:
            if not lo <= off < lo + size:
                continue
            addr = int(val, 16) if rtype.endswith("RELATIVE") and re.fullmatch(r"[0-9a-f]+", val) else None
            name = elf.funcs.get(addr, val) if addr is not None else val
            if name == crt:
                continue
            why = [f"`{_demangle([name])[0]}` runs at unload/exit (a destructor)"] if sec == ".fini_array" else \
                _check_registration(elf, name, backend, by_func, data)
            found += [Violation(STATIC_CONSTRUCTOR, w) for w in dict.fromkeys(why)]
            reg_funcs.add(name)  # load-time code: may touch registration data (its own faults are reported)
            reg_funcs.update(_callee(i.target) for i in by_func.get(name, ()) if _HELPERS.fullmatch(_callee(i.target)))
    found += [Violation(STATIC_CONSTRUCTOR, f"the library has a {sec} section")
              for sec in (".ctors", ".dtors", ".preinit_array") if sec in secs]
    for _, rtype, name in elf.relocs:
        if rtype == "IFUNC" or rtype.endswith("IRELATIVE"):
            name = elf.funcs.get(int(name, 16), name) if re.fullmatch(r"[0-9a-f]+", name) else name
            found.append(Violation(STATIC_CONSTRUCTOR, f"IFUNC `{_demangle([name])[0]}`: a resolver runs at load time"))
    for sec in (".init", ".fini"):  # crti/crtn only: _init calls __gmon_start__ through the GOT, nothing else
        code = [i for i in elf.insns if secs.get(sec) and secs[sec][1] <= i.addr < secs[sec][1] + secs[sec][2]]
        calls = [i for i in code if _branch(elf, i) and not (i.target and i.target.startswith(("_init", "_fini")))]
        if len(code) > 10 or len(calls) > (1 if sec == ".init" else 0):
            found.append(Violation(STATIC_CONSTRUCTOR, f"code added to the {sec} section runs at load/unload"))
    found += [Violation(MUTABLE_GLOBAL_STATE if _CRT_DATA.fullmatch(name) else STATIC_CONSTRUCTOR,
                        f"kernel code defines `{name}`, a toolchain symbol") for name in _CRT_UNIQUE
              if elf.names.get(name, 0) > 1]
    return found, reg_funcs


def _global_state(elf: Elf, backend: str, allowed_libs, reg_funcs: set[str]) -> list[Violation]:
    secs = [s for s in elf.sections if "W" in s[3] and "A" in s[3] and s[0] not in (".got", ".got.plt")
            and ("T" in s[3] or not any(lo <= s[1] and s[1] + s[2] <= hi for lo, hi in elf.relro))]
    found = [Violation(MUTABLE_GLOBAL_STATE, f"writable section {name} ({size} bytes) in the library")
             for name, _, size, flags in secs
             if "T" in flags or name not in (".data", ".bss", ".nvFatBinSegment", ".tm_clone_table")]
    refs: dict[str, list[Insn]] = {}
    objs = [o for o in elf.objects if any(lo <= o[1] < lo + sz for _, lo, sz, _ in secs)]
    for i in elf.insns:
        if i.ref is not None and i.func not in _CRT_UNIQUE:  # crtstuff's own (unique) code: __TMC_END__ etc.
            for name, addr, size, _ in objs:
                if addr <= i.ref < addr + max(size, 1):
                    refs.setdefault(name, []).append(i)
    creators = set().union(*(_CREATORS.get(x, set()) for x in [backend, *allowed_libs]))
    index = {id(i): k for k, i in enumerate(elf.insns)}

    def handed_to_creator(i: Insn) -> bool:  # `lea h,%rdi` then a create call; %rdi not copied in between
        if not (i.mnem.startswith("lea") and i.ops.endswith(",%rdi")):
            return False
        for j in elf.insns[index[id(i)] + 1:index[id(i)] + 6]:
            if _branch(elf, j):
                return _callee(j.target) in creators and j.func == i.func
            if re.search(r"%(rdi|edi|di|dil)\b", j.ops):
                return False
        return False
    allowed: set[str] = set()
    for name, _addr, size, typ in sorted(objs, key=lambda o: o[0].startswith("_ZGV")):  # guards last
        touch = [i for i in refs.get(name, []) if _is_store(elf, i) or i.mnem.startswith("lea") or elf.aarch64]
        if typ == "TLS":
            why = "thread-local variable"
        elif _CRT_DATA.fullmatch(name) and size <= 8:
            continue
        elif _REG_DATA.fullmatch(name):
            bad = [i.func for i in refs.get(name, []) if i.func not in reg_funcs | {"krl_register", "krl_ops"}
                   and not (i.func.startswith("_ZL26__cudaUnregisterBinaryUtil") and not _is_store(elf, i))]
            if not bad:
                allowed.add(name)
                continue
            why = f"registration data used by `{_demangle([bad[0]])[0]}`"
        elif (_NVCC_TMP.fullmatch(name) and size == 1) or (name.startswith("_ZGV") and "_Z" + name[4:] in allowed):
            allowed.add(name)  # nvcc's launch-stub flag; the guard of an allowed function-local static
            continue
        elif size == 8 and not elf.aarch64 and all(handed_to_creator(i) for i in touch):
            allowed.add(name)  # a library handle written only by its create call: `if (!h) cublasCreate(&h);`
            continue
        elif name.startswith("_ZGV") and any(o[0] == "_Z" + name[4:] for o in objs):
            continue  # the guard of a refused function-local static: that one is reported
        else:
            why = "mutable global/static variable" + (" (a cuBLAS/cuDNN handle may only be set by its create "
                                                      "call: `if (!h) cublasCreate(&h);`)" if allowed_libs else "")
        found.append(Violation(MUTABLE_GLOBAL_STATE, f"`{_demangle([name])[0]}` ({size} bytes): {why}; results must "
                                                     "not be kept across calls (use const/constexpr tables, "
                                                     "pass buffers from model_new.py)"))
    for sname, lo, size, _ in secs:  # writable bytes no symbol accounts for (hand-written .data via asm)
        hidden, pos = 0, lo  # a gap must be alignment padding: shorter than the next object's alignment
        for _, addr, osize, _ in sorted((o for o in objs if lo <= o[1] < lo + size), key=lambda o: o[1]):
            if addr - pos >= min(elf.align.get(sname, 1), addr & -addr or 64):
                hidden = addr - pos
                break
            pos = max(pos, addr + (osize or 8))
        hidden = hidden or (lo + size - pos if lo + size - pos >= 8 else 0)
        if hidden:
            found.append(Violation(MUTABLE_GLOBAL_STATE, f"{hidden} bytes of writable data in {sname} without a "
                                                         "symbol (hand-written data)"))
    return found


def _raw_syscalls(elf: Elf) -> list[Violation]:
    found = [Violation(RAW_SYSCALL, f"executable section {s[0]} in the library (hand-written code)")
             for s in elf.sections if "X" in s[3] and s[0] not in _EXEC_OK]
    for i in elf.insns:
        if i.mnem in ("syscall", "sysenter", "svc") or (i.mnem == "int" and "0x80" in i.ops):
            found.append(Violation(RAW_SYSCALL, f"`{f'{i.mnem} {i.ops}'.strip()}` instruction in `{i.func}` "
                                                "(a raw system call: inline assembly is not allowed)"))
    return found


def inspect_library(path: Path, backend: str, allowed_libs=(), module: str = "") -> list[Violation]:
    """Every policy violation of the built library (empty: it may be loaded into the candidate process).
    `module`: the library is the torch extension of that name (binpolicy_torch.py)."""
    libs = [lib for lib in allowed_libs if lib in _LIB_ALLOW]
    try:
        elf = _parse(Path(path))
        undefined = _tool("nm", "-D", "--undefined-only", "--format=just-symbols", str(path)).split()
    except (OSError, RuntimeError, subprocess.SubprocessError, ValueError) as exc:
        log.warning("cannot inspect %s: %s", path, exc)
        return [Violation(FORBIDDEN_SYMBOL, f"the library could not be inspected: {exc}")]
    found = check_symbols(undefined, backend, libs, torch_ext=bool(module))
    ok_needed = re.compile(_NEEDED[backend] + "".join(rf"|lib{x}\.so\.\d+" for x in libs)
                           + (binpolicy_torch.NEEDED if module else ""))
    found += [Violation(FORBIDDEN_SYMBOL, f"the library links {n}, which kernels may not use")
              for n in elf.needed if not ok_needed.fullmatch(n)]
    ctor, reg_funcs = _constructors(elf, backend, elf.by_func, {addr: name for name, addr, _, _ in elf.objects})
    state = ctor + _global_state(elf, backend, libs, reg_funcs)
    found += [v for v in state if not (module and binpolicy_torch.allowed_extension_state(v, module))]
    found += _raw_syscalls(elf)
    return list(dict.fromkeys(found))  # Violation is frozen: hashable, first occurrence kept


def writable_symbols(library: Path, backend: str = "cpu") -> list[str]:
    """Names of the mutable global/static objects in the library (formerly backends.cpu.writable_symbols)."""
    return [m.group(1) for v in inspect_library(library, backend) if v.name == MUTABLE_GLOBAL_STATE
            for m in [re.match(r"`([^`]+)`", v.detail)] if m]
