"""The binary policy on real builds: hacks the source rules miss are refused by what the library does."""
from __future__ import annotations

import copy

import pytest

from sandbox_workers import binpolicy, guards, workspace
from sandbox_workers.compiler import compile_workspace
from tests.sandbox.helpers import ROOT, relu_with_body

PASTE = "#define CAT_(a, b) a##b\n#define CAT(a, b) CAT_(a, b)\n"
RELU = "for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;"

# name -> (kernel body, code before it, includes, expected violation); none is caught by guards.check_cpp
HACKS = {
    "token_pasted_fopen": (f"y[0] = CAT(fo, pen)(\"model.py\", \"r\") ? 1.f : 0.f; {RELU}",
                           PASTE + 'extern "C" void* CAT(fo, pen)(const char*, const char*);', "",
                           guards.FORBIDDEN_SYMBOL),
    "macro_include_dlsym_libtorch": (
        "void* f = CAT(dl, sym)(RTLD_DEFAULT, \"_ZN2at4_ops4relu4callERKNS_6TensorE\");\n"
        f"if (f) ((void (*)())f)(); {RELU}", PASTE + "#define DLH <dlfcn.h>\n#include DLH", "",
        guards.FORBIDDEN_SYMBOL),
    "open64": (f"y[0] = (float)open64(\"model.py\", 0); {RELU}", 'extern "C" int open64(const char*, int, ...);', "",
               guards.FORBIDDEN_SYMBOL),
    "creat": (f"y[0] = (float)creat(\"/tmp/leak\", 0644); {RELU}", 'extern "C" int creat(const char*, unsigned);', "",
              guards.FORBIDDEN_SYMBOL),
    "raw_syscall_function": (f"y[0] = (float)CAT(sys, call)(SYS_getpid); {RELU}",
                             PASTE + "#define SYSH <sys/syscall.h>\n#include SYSH\n"
                                     'extern "C" long CAT(sys, call)(long, ...);', "", guards.RAW_SYSCALL),
    "inline_asm_syscall": ("long r; CAT(__as, m__) volatile(\"syscall\" : \"=a\"(r) : \"a\"(39L) : \"rcx\", \"r11\", "
                           f"\"memory\");\ny[0] = (float)r; {RELU}", PASTE, "", guards.RAW_SYSCALL),
    "pthread_create": (f"unsigned long t; CAT(pthread_, create)(&t, nullptr, work, nullptr); {RELU}",
                       PASTE + 'extern "C" int CAT(pthread_, create)(unsigned long*, const void*, void* (*)(void*), '
                               'void*);\nstatic void* work(void*) { return nullptr; }', "", guards.FORBIDDEN_SYMBOL),
    # g++ folds a TU's constructors into its _GLOBAL__sub_I_ function: the policy judges what that code does
    "dunder_constructor": (RELU, 'extern "C" void omp_set_num_threads(int);\n'
                                 "__attribute__((__constructor__)) static void boot() { omp_set_num_threads(1); }", "",
                           guards.STATIC_CONSTRUCTOR),
    "init_array_entry": (RELU, 'extern "C" void omp_set_num_threads(int);\n'
                               "static void boot() { omp_set_num_threads(1); }\n"
                               '__attribute__((section(".init_array"), used)) static void (*g_boot)() = boot;', "",
                         guards.STATIC_CONSTRUCTOR),
    "static_cache": ("if (n <= 1024 && g_cache[0] == x[0]) { for (int64_t i = 0; i < n; ++i) y[i] = g_cache[i]; "
                     f"return; }}\n{RELU}\nfor (int64_t i = 0; i < n && i < 1024; ++i) g_cache[i] = y[i];",
                     "static float g_cache[1024];", "", guards.MUTABLE_GLOBAL_STATE),
    "static_object_constructor": (f"y[0] = (float)g_boot.v; {RELU}",
                                  "struct Boot { Boot() { v = 7; } int v; };\nstatic Boot g_boot;", "",
                                  guards.STATIC_CONSTRUCTOR),
    "pyrun_simplestring": (RELU, 'extern "C" int PyRun_SimpleString(const char*);\n'
                                 'static int g_boot = PyRun_SimpleString("import os");', "", guards.FORBIDDEN_SYMBOL),
    "sleef_by_hand": ("for (int64_t i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, Sleef_expf8_u10("
                      "_mm256_loadu_ps(x + i)));", 'extern "C" __m256 Sleef_expf8_u10(__m256);',
                      "#include <immintrin.h>", guards.FORBIDDEN_SYMBOL),
}


@pytest.mark.parametrize("name", sorted(HACKS))
def test_hacks_past_the_text_rules_are_refused_by_the_binary_policy(sb_cfg, name):
    body, extra, includes, expected = HACKS[name]
    files = relu_with_body(body, extra_cpp=extra, includes=includes)
    assert guards.check_cpp(files, "cpu") == [], "the text rules catch it: not a test of the binary policy"
    out = compile_workspace(files, "cpu", sb_cfg)
    assert not out.ok and expected in out.violations, (out.violations, out.error, out.log)
    assert out.library is None and "breaks the kernel rules" in out.error
    assert f"{expected}: " in out.log  # each finding reaches the agent by name, with its symbol


def test_findings_name_the_symbol(sb_cfg):
    out = compile_workspace(relu_with_body(*HACKS["macro_include_dlsym_libtorch"][:2]), "cpu", sb_cfg)
    assert "`dlsym`" in out.error and "dynamic loading" in out.error
    out = compile_workspace(relu_with_body(*HACKS["static_cache"][:2]), "cpu", sb_cfg)
    assert out.violations == [guards.MUTABLE_GLOBAL_STATE] and "`g_cache`" in out.error


CPU_EXAMPLES = sorted((ROOT / "skills" / "examples").glob("cpu_*"))


@pytest.mark.parametrize("example", CPU_EXAMPLES, ids=lambda p: p.name)
def test_shipped_cpu_examples_pass_the_policy(sb_cfg, example):
    out = compile_workspace(workspace.read_dir(example), "cpu", sb_cfg)
    assert out.ok, out.error + "\n" + out.log
    assert binpolicy.inspect_library(out.library, "cpu") == []


@pytest.mark.parametrize("flags,body,includes", [
    (["-O0"], RELU, ""),  # -O0 keeps KRL_OP's registration variable and a helper static initialiser
    (["-Os", "-ffast-math"], "#pragma omp parallel for\nfor (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]) + "
                              "std::tanh(x[i]) + erff(x[i]);", "#include <cmath>"),
    ([], "std::vector<float> t(x, x + n); std::sort(t.begin(), t.end()); for (int64_t i = 0; i < n; ++i) "
         "y[i] = t[i] + kLut[i & 3];", "#include <vector>\n#include <algorithm>\n"
                                      "static const float kLut[4] = {0.f, 0.f, 0.f, 0.f};"),
])
def test_honest_code_passes(sb_cfg, flags, body, includes):
    files = relu_with_body(body, includes=includes)
    out = compile_workspace(files, "cpu", sb_cfg, extra_flags=flags)
    assert out.ok, out.error + "\n" + out.log


def test_policy_is_part_of_the_artifact_key(sb_cfg):
    from sandbox_workers.compiler import cache_key

    files = relu_with_body(RELU)
    off = copy.deepcopy(sb_cfg)
    off.sandbox.static_guards = False  # an unchecked build must never be served to a checked lookup
    assert cache_key(files, "cpu", sb_cfg) != cache_key(files, "cpu", off)


def test_writable_symbols_reexport(sb_cfg):
    from sandbox_workers.backends.cpu import writable_symbols

    off = copy.deepcopy(sb_cfg)
    off.sandbox.static_guards = False
    out = compile_workspace(relu_with_body(*HACKS["static_cache"][:2]), "cpu", off)
    assert out.ok and writable_symbols(out.library) == ["g_cache"]


# ---------------------------------------------------------------- CUDA: the allow-list as a pure function
HONEST_CUDA = ["__cudaRegisterFatBinary@libcudart.so.13", "__cudaRegisterFatBinaryEnd@libcudart.so.13",
               "__cudaRegisterFunction@libcudart.so.13", "__cudaUnregisterFatBinary@libcudart.so.13",
               "__cudaPushCallConfiguration@libcudart.so.13", "__cudaPopCallConfiguration@libcudart.so.13",
               "__cudaLaunchKernel@libcudart.so.13", "__cudaGetKernel@libcudart.so.13", "cudaLaunchKernel",
               "cudaGetLastError", "cudaGetErrorString", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaFuncSetAttribute",
               "cudaGetDevice", "cudaDeviceGetAttribute", "cudaGetDeviceProperties_v2",
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor", "cudaStreamSynchronize", "__cxa_atexit@GLIBC_2.2.5",
               "__cxa_finalize@GLIBC_2.2.5", "__cxa_guard_acquire@CXXABI_1.3", "__gxx_personality_v0@CXXABI_1.3",
               "_Unwind_Resume@GCC_3.0", "exit@GLIBC_2.2.5", "expf@GLIBC_2.27", "_ITM_registerTMCloneTable",
               "__gmon_start__", "_Znwm@GLIBCXX_3.4", "_ZdlPvm@CXXABI_1.3.9", "memcpy@GLIBC_2.14"]


def test_cuda_allow_list_accepts_what_nvcc_and_honest_host_code_need():
    assert binpolicy.check_symbols(HONEST_CUDA, "cuda") == []


@pytest.mark.parametrize("sym,name", [
    ("cudaMalloc", guards.FORBIDDEN_SYMBOL), ("cudaFree", guards.FORBIDDEN_SYMBOL),
    ("cudaMallocAsync", guards.FORBIDDEN_SYMBOL), ("cudaStreamCreateWithFlags", guards.FORBIDDEN_SYMBOL),
    ("cudaEventCreate", guards.FORBIDDEN_SYMBOL), ("cudaGraphLaunch", guards.FORBIDDEN_SYMBOL),
    ("cudaIpcGetMemHandle", guards.FORBIDDEN_SYMBOL), ("cudaHostAlloc", guards.FORBIDDEN_SYMBOL),
    ("cudaMallocHost", guards.FORBIDDEN_SYMBOL), ("cudaMemcpyToSymbol", guards.FORBIDDEN_SYMBOL),
    ("cudaLaunchHostFunc", guards.FORBIDDEN_SYMBOL), ("cudaGetDriverEntryPoint", guards.FORBIDDEN_SYMBOL),
    ("cuLaunchKernel", guards.FORBIDDEN_SYMBOL), ("dlsym@GLIBC_2.34", guards.FORBIDDEN_SYMBOL),
    ("dl_iterate_phdr", guards.FORBIDDEN_SYMBOL), ("syscall@GLIBC_2.2.5", guards.RAW_SYSCALL),
    ("open64", guards.FORBIDDEN_SYMBOL), ("fopen", guards.FORBIDDEN_SYMBOL), ("mmap", guards.FORBIDDEN_SYMBOL),
    ("socket", guards.FORBIDDEN_SYMBOL), ("popen", guards.FORBIDDEN_SYMBOL), ("pthread_create",
                                                                             guards.FORBIDDEN_SYMBOL),
    ("PyRun_SimpleString", guards.FORBIDDEN_SYMBOL), ("_Py_NoneStruct", guards.FORBIDDEN_SYMBOL),
    ("_ZN2at6native4reluERKNS_6TensorE", guards.FORBIDDEN_SYMBOL), ("_ZN3c104impl3tlsEv", guards.FORBIDDEN_SYMBOL),
    ("Sleef_expf8_u10", guards.FORBIDDEN_SYMBOL), ("GOMP_parallel@GOMP_4.0", guards.FORBIDDEN_SYMBOL),
    ("some_unknown_function", guards.FORBIDDEN_SYMBOL),
])
def test_cuda_allow_list_denies(sym, name):
    found = binpolicy.check_symbols([sym], "cuda")
    assert [v.name for v in found] == [name] and f"`{binpolicy._demangle([sym.split('@')[0]])[0]}`" in found[0].detail


def test_cublas_and_cudnn_only_when_linked():
    gemm = ["cublasCreate_v2", "cublasSetStream_v2", "cublasSgemm_v2", "cublasLtMatmul"]
    assert len(binpolicy.check_symbols(gemm, "cuda")) == 4
    assert binpolicy.check_symbols(gemm, "cuda", ["cublas", "cublasLt"]) == []
    assert len(binpolicy.check_symbols(["cublasLoggerConfigure", "cublasXtSgemm"], "cuda", ["cublas"])) == 2
    assert len(binpolicy.check_symbols(["cudnnConvolutionForward"], "cuda", ["cublas"])) == 1
    assert binpolicy.check_symbols(["cudnnConvolutionForward"], "cuda", ["cudnn"]) == []


def test_cpu_allow_list():
    ok = ["GOMP_parallel@GOMP_4.0", "GOMP_barrier@GOMP_1.0", "omp_get_thread_num@OMP_1.0", "expf@GLIBC_2.27",
          "__expf_finite", "_ZGVdN8v_expf@GLIBC_2.22", "tanhf", "erff", "fmaxf", "lroundf", "memset@GLIBC_2.2.5",
          "__memcpy_chk", "posix_memalign", "_ZSt20__throw_length_errorPKc@GLIBCXX_3.4", "__stack_chk_fail"]
    assert binpolicy.check_symbols(ok, "cpu") == []
    bad = ["omp_get_wtime", "GOMP_target_ext", "cudaLaunchKernel", "clock_gettime", "getenv",
           "_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE"]
    assert len(binpolicy.check_symbols(bad, "cpu")) == len(bad)


@pytest.mark.gpu
@pytest.mark.parametrize("example,flags", [("cuda_19_relu", []), ("cuda_40_LayerNorm", ["-O0"]),
                                           ("cuda_99_Matmul_GELU_Softmax", ["-O2", "--use_fast_math"])])
def test_shipped_cuda_examples_pass_the_policy(sb_cfg, example, flags):
    # -O0: nvcc's host code stays optimised (its -O0 registration calls through pointers, see cuda.py)
    out = compile_workspace(workspace.read_dir(ROOT / "skills" / "examples" / example), "cuda", sb_cfg, flags)
    assert out.ok, out.error + "\n" + out.log
    assert binpolicy.inspect_library(out.library, "cuda") == []
