"""Generator unit tests on small C snippets, run through the real preprocess + pycparser path."""

from __future__ import annotations

import ast
import ctypes
import textwrap

import pytest

pytest.importorskip("pycparser")
pytest.importorskip("jinja2")

from codegen.annotations import AnnotationError, Annotator  # noqa: E402
from codegen.attribute_types import AttributeTypeError, read_attribute_types  # noqa: E402
from codegen.model import Alias, Bindings, Enum, EnumMember  # noqa: E402
from codegen.parse import ParseError, parse, strip_common_prefix  # noqa: E402
from codegen.render import render  # noqa: E402
from codegen.sources import HeaderSet  # noqa: E402

API_H = """
#define CUBLAS_VER_MAJOR 99
#define CUBLAS_VER_MINOR 1
#define CUBLAS_VER_PATCH 2
#define CUBLAS_VER_BUILD 3
#include <library_types.h>
typedef enum { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1 } cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_HERMITAN = 2, CUBLAS_OP_C = CUBLAS_OP_HERMITAN } cublasOperation_t;
"""
LIBRARY_TYPES_H = """
typedef enum cudaDataType_t { CUDA_R_16F = 2, CUDA_R_32F = 0 } cudaDataType;
typedef enum cudaDataType_t cudaDataType_t;
"""


def generate(tmp_path, lt_body: str):
    (tmp_path / "cublasLt.h").write_text("#include <cublas_api.h>\n#include <stdint.h>\n#include <stddef.h>\n"
                                         + textwrap.dedent(lt_body))
    (tmp_path / "cublas_api.h").write_text(API_H)
    (tmp_path / "library_types.h").write_text(LIBRARY_TYPES_H)
    bindings = parse(HeaderSet(tmp_path, ["snippet"]))
    namespace: dict = {}
    exec(compile(render(bindings), "<generated>", "exec"), namespace)
    return bindings, namespace


def test_enum_expressions_and_cross_references(tmp_path):
    _, ns = generate(tmp_path, """
        typedef enum {
          SNIP_MODE_A,
          SNIP_MODE_B = 0x10,
          SNIP_MODE_C,
          SNIP_MODE_D = -3,
          SNIP_MODE_E = SNIP_MODE_B | SNIP_MODE_C,
          SNIP_MODE_F = (1 << 4) | 2,
          SNIP_MODE_G = CUBLAS_OP_C + 100,
          SNIP_MODE_H = ~0,
        } snipMode_t;
    """)
    mode = ns["snipMode_t"]
    assert mode.A == 0 and mode.B == 16 and mode.C == 17 and mode.D == -3
    assert mode.E == 16 | 17 and mode.F == 18 and mode.G == 102 and mode.H == -1
    assert ns["SNIP_MODE_E"] is mode.E
    # values from the other headers are bound too, aliases included
    assert ns["cublasOperation_t"].C == 2 and ns["CUBLAS_OP_C"] == 2
    assert ns["cudaDataType_t"] is ns["cudaDataType"] and ns["CUDA_R_16F"] == 2


def test_prefix_stripping_keeps_identifiers_valid():
    assert strip_common_prefix(["CUBLAS_COMPUTE_16F", "CUBLAS_COMPUTE_32F"]) == ["COMPUTE_16F", "COMPUTE_32F"]
    assert strip_common_prefix(["X_EPI_RELU", "X_EPI_GELU_AUX"]) == ["RELU", "GELU_AUX"]
    assert strip_common_prefix(["X_TILE_8x8", "X_TILE_16x8"]) == ["TILE_8x8", "TILE_16x8"]


def test_a_known_prefix_keeps_names_when_members_stop_sharing_one():
    """cuBLAS 13.10 added CUBLASLT_GROUPED_MATRIX_LAYOUT_* to the layout attributes."""
    names = ["CUBLASLT_MATRIX_LAYOUT_ORDER", "CUBLASLT_MATRIX_LAYOUT_LD", "CUBLASLT_GROUPED_MATRIX_LAYOUT_LD_ARRAY"]
    assert strip_common_prefix(names) == ["MATRIX_LAYOUT_ORDER", "MATRIX_LAYOUT_LD", "GROUPED_MATRIX_LAYOUT_LD_ARRAY"]
    assert strip_common_prefix(names, "CUBLASLT_MATRIX_LAYOUT_") == ["ORDER", "LD", "GROUPED_MATRIX_LAYOUT_LD_ARRAY"]


def test_members_whose_python_names_would_clash_fail_generation(tmp_path):
    with pytest.raises(ParseError, match="MEMBER_PREFIXES"):
        generate(tmp_path, """
            typedef enum { CUBLASLT_MATRIX_LAYOUT_X_LD = 0, CUBLASLT_X_LD = 1 } cublasLtMatrixLayoutAttribute_t;
        """)


def test_functions_prototypes_arrays_callbacks_and_inline_helpers(tmp_path):
    bindings, ns = generate(tmp_path, """
        typedef struct snipContext* snipHandle_t;
        typedef struct { uint64_t data[8]; } snipAlgo_t;
        typedef void (*snipCallback_t)(int level, const char* message);
        cublasStatus_t snipCreate(snipHandle_t* handle);
        size_t snipVersion(void);
        unsigned snipEmpty();
        cublasStatus_t snipIds(snipHandle_t handle, int count, int idsArray[], snipAlgo_t algos[4]);
        cublasStatus_t snipSetCallback(snipCallback_t callback);
        const char* snipName(cublasStatus_t status);
        static inline cublasStatus_t snipInit(snipHandle_t h) { return snipCreate(&h); }
    """)
    functions = {f.name: f for f in bindings.functions}
    assert list(functions) == ["snipCreate", "snipVersion", "snipEmpty", "snipIds", "snipSetCallback", "snipName"]
    assert functions["snipCreate"].returns_status and not functions["snipVersion"].returns_status
    table = ns["FUNCTIONS"]
    assert table["snipVersion"][2] == [] and table["snipEmpty"][2] == []  # (void) and ()
    assert table["snipEmpty"][0] is ctypes.c_uint
    restype, _, argtypes, names, _ = table["snipIds"]
    assert names == ("handle", "count", "idsArray", "algos")
    assert argtypes[0] is ctypes.c_void_p  # handles are plain pointers
    assert argtypes[2] is ctypes.POINTER(ctypes.c_int)
    assert argtypes[3] is ctypes.POINTER(ns["snipAlgo_t"])  # array parameters decay to pointers
    assert table["snipName"][0] is ctypes.c_char_p
    callback = ns["snipCallback_t"]
    assert callback._restype_ is None and callback._argtypes_ == (ctypes.c_int, ctypes.c_char_p)
    assert ctypes.sizeof(ns["snipAlgo_t"]) == 64


def test_define_constants_are_evaluated(tmp_path):
    _, ns = generate(tmp_path, """
        #define CUBLASLT_SNIP_FLAG_A (0x01ull << 0)
        #define CUBLASLT_SNIP_FLAG_B (0x02ull << 8)
        #define CUBLASLT_SNIP_MASK (CUBLASLT_SNIP_FLAG_A | CUBLASLT_SNIP_FLAG_B)
        #define CUBLASLT_SNIP_BIG (0x01ull << 32)
        #define SNIPAPI
    """)
    assert ns["CUBLASLT_SNIP_FLAG_B"] == 0x200 and ns["CUBLASLT_SNIP_MASK"] == 0x201
    assert ns["CUBLASLT_SNIP_BIG"] == 2**32
    assert "SNIPAPI" not in ns


def test_attribute_types_from_doc_comments(tmp_path):
    bindings, ns = generate(tmp_path, """
        typedef enum {
          /** Leading dimension.
           *
           * int64_t, default: 0
           */
          CUBLASLT_SNIP_DESC_LD = 0,
          /** A pointer whose direction depends on the epilogue.
           *
           * Forward pass: void *, default: NULL
           * Backward pass: const void *, default: NULL
           */
          CUBLASLT_SNIP_DESC_POINTER,
          /** Supported tiles.
           *
           * array of uint32_t
           */
          CUBLASLT_SNIP_DESC_IDS,
          /** A mode, see cudaDataType.
           *
           * int32_t based on cudaDataType, default: -1
           */
          CUBLASLT_SNIP_DESC_TYPE,
          /** Waves.
           *
           * float, default: 0.0f
           */
          CUBLASLT_SNIP_DESC_WAVES,
        } cublasLtSnipDescAttributes_t;
        typedef struct { uint64_t data[4]; } snipDescOpaque_t;
        typedef snipDescOpaque_t* snipDesc_t;
        cublasStatus_t cublasLtSnipDescSetAttribute(snipDesc_t d, cublasLtSnipDescAttributes_t attr, const void* buf, size_t n);
        cublasStatus_t cublasLtSnipDescGetAttribute(snipDesc_t d, cublasLtSnipDescAttributes_t attr, void* buf, size_t n, size_t* written);
    """)
    attrs = ns["cublasLtSnipDescAttributes_t"]
    getter, setter, types = ns["ATTRIBUTES"][attrs]
    assert (getter, setter) == ("cublasLtSnipDescGetAttribute", "cublasLtSnipDescSetAttribute")
    assert types[attrs.LD] == (ctypes.c_int64, False)
    assert types[attrs.POINTER] == (ctypes.c_void_p, False)
    assert types[attrs.IDS] == (ctypes.c_uint32, True)
    assert types[attrs.TYPE] == (ctypes.c_int32, False)
    assert types[attrs.WAVES] == (ctypes.c_float, False)


def test_attribute_without_a_stated_type_fails_generation(tmp_path):
    with pytest.raises(AttributeTypeError, match="CUBLASLT_SNIP_DESC_MYSTERY"):
        generate(tmp_path, """
            typedef enum {
              /** Something, with no type given. */
              CUBLASLT_SNIP_DESC_MYSTERY = 0,
            } cublasLtSnipDescAttributes_t;
        """)


def test_unknown_type_is_an_error_not_a_guess(tmp_path):
    with pytest.raises(ParseError):
        generate(tmp_path, """
            typedef struct snipThing snipThing;
            cublasStatus_t snipUse(snipThing thing);
        """)


def test_attribute_types_read_through_a_resolver_alone():
    """No parser needed: any lookup of typedef names serves."""
    header = """
        typedef enum {
          /** int32_t based on snipMode_t */
          CUBLASLT_SNIP_ATTR_MODE = 0,
          /** snipMode_t, default: 0 */
          CUBLASLT_SNIP_ATTR_ENUM = 1,
          /** snipHandle_t */
          CUBLASLT_SNIP_ATTR_HANDLE = 2,
          /** unsigned, default: 0 */
          CUBLASLT_SNIP_ATTR_COUNT = 3,
        } cublasLtSnipAttributes_t;
    """
    members = ["CUBLASLT_SNIP_ATTR_MODE", "CUBLASLT_SNIP_ATTR_ENUM", "CUBLASLT_SNIP_ATTR_HANDLE",
               "CUBLASLT_SNIP_ATTR_COUNT"]
    declared = {
        "cublasLtSnipAttributes_t": Enum("cublasLtSnipAttributes_t", "cublasLt.h",
                                         [EnumMember(m, m, i) for i, m in enumerate(members)]),
        "snipMode_t": Enum("snipMode_t", "cublasLt.h", []),
        "snipHandle_t": Alias("snipHandle_t", "cublasLt.h", "ctypes.c_void_p"),
    }
    (table,) = read_attribute_types(header, declared.get).values()
    assert [(t.member, t.ctype, t.is_array) for t in table] == [
        ("CUBLASLT_SNIP_ATTR_MODE", "ctypes.c_int32", False),
        ("CUBLASLT_SNIP_ATTR_ENUM", "ctypes.c_int32", False),
        ("CUBLASLT_SNIP_ATTR_HANDLE", "ctypes.c_void_p", False),
        ("CUBLASLT_SNIP_ATTR_COUNT", "ctypes.c_uint", False),
    ]


def test_a_header_set_removes_only_the_directory_it_made(tmp_path):
    (tmp_path / "cublasLt.h").write_text("/* empty */\n")
    with HeaderSet.gather({"cublasLt.h": tmp_path / "cublasLt.h"}, ["snippet"]) as gathered:
        assert gathered.directory != tmp_path and (gathered.directory / "cublasLt.h").is_file()
    assert not gathered.directory.exists()
    with HeaderSet(tmp_path, ["snippet"]) as given:
        pass
    assert (given.directory / "cublasLt.h").is_file()


def _typed_declarations(text: str) -> dict[str, ast.FunctionDef]:
    """The functions the generated module declares for type checkers (its ``TYPE_CHECKING`` block)."""
    block = next(node for node in ast.parse(text).body if isinstance(node, ast.If)
                 and ast.unparse(node.test) == "typing.TYPE_CHECKING")
    return {node.name: node for node in block.body if isinstance(node, ast.FunctionDef)}


def test_functions_are_declared_for_type_checkers_as_ctypes_takes_them(tmp_path):
    bindings, ns = generate(tmp_path, """
        typedef struct snipContext* snipHandle_t;
        typedef struct { uint64_t data[8]; } snipAlgo_t;
        typedef void (*snipCallback_t)(int level, const char* message);
        typedef uint64_t snipFlags_t;
        cublasStatus_t snipCreate(snipHandle_t* handle);
        cublasStatus_t snipRun(snipHandle_t handle, cudaDataType type, const void* alpha, size_t bytes,
                               double scale, snipFlags_t flags, snipAlgo_t algos[], int* count);
        cublasStatus_t snipSetCallback(snipCallback_t callback);
        const char* snipName(cublasStatus_t status);
        size_t snipVersion(void);
        void snipReset(int lambda);
    """)
    declared = _typed_declarations(render(bindings))
    assert list(declared) == [f.name for f in bindings.functions]
    assert not any(name in ns for name in declared)  # declarations only: at run time the library's are bound

    def signature(name):
        node = declared[name]
        assert not node.args.args and not node.args.kwonlyargs  # ctypes takes no keywords: positional only
        return [(a.arg, ast.unparse(a.annotation)) for a in node.args.posonlyargs], ast.unparse(node.returns)

    assert signature("snipCreate") == ([("handle", "_PointerTo[snipHandle_t]")], "int")
    assert signature("snipRun") == ([
        ("handle", "_VoidPointer"), ("type", "int"), ("alpha", "_VoidPointer"), ("bytes", "int"),
        ("scale", "float"), ("flags", "int"), ("algos", "_PointerTo[snipAlgo_t]"),
        ("count", "_PointerTo[ctypes.c_int]")], "int")
    assert signature("snipSetCallback") == ([("callback", "_Callback")], "int")
    assert signature("snipName") == ([("status", "int")], "typing.Optional[bytes]")
    assert signature("snipVersion") == ([], "int")
    assert signature("snipReset") == ([("lambda_", "int")], "None")  # a keyword as a C name
    assert ast.get_docstring(declared["snipName"]) == "const char *snipName(cublasStatus_t status)"


def test_a_ctypes_type_without_an_annotation_fails_generation():
    annotator = Annotator(Bindings((1, 0, 0, 0), [], [], [], [], []))
    assert annotator.argument("ctypes.POINTER(ctypes.POINTER(ctypes.c_int))") == \
        "_PointerTo[ctypes._Pointer[ctypes.c_int]]"
    with pytest.raises(AnnotationError, match="ctypes.c_wchar"):
        annotator.argument("ctypes.c_wchar")
