/* polytile's C API: parse Tile programs, differentiate them, compile them for the CPU and run them on
 * memory the caller owns. Every function that can fail returns a polytile_status; on failure,
 * polytile_last_error() says why in one line (the same message the command line prints). Handles are
 * opaque and freed by their _free function (NULL is ignored). Thread safety: handles may be used from
 * several threads at once (a compiled program runs concurrently on disjoint outputs); the last error is
 * per thread. */
#ifndef POLYTILE_POLYTILE_H
#define POLYTILE_POLYTILE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum polytile_status {
  POLYTILE_OK = 0,
  POLYTILE_USER_ERROR = 1,     /* something the caller can fix: bad text, shapes, arguments */
  POLYTILE_INTERNAL_ERROR = 2  /* a bug in polytile */
} polytile_status;

/* f16 elements are IEEE binary16 bits (a uint16_t each; _Float16 where the compiler has it). */
typedef enum polytile_dtype {
  POLYTILE_F32 = 0,
  POLYTILE_F64 = 1,
  POLYTILE_I32 = 2,
  POLYTILE_BOOL = 3,
  POLYTILE_I64 = 4,
  POLYTILE_F16 = 5
} polytile_dtype;

/* A named tensor in the caller's memory: contiguous row-major, elements as in C (bool: one byte). For
 * polytile_compile only the name, dtype and shape are read. */
typedef struct polytile_tensor {
  const char* name;
  void* data;
  int dtype; /* a polytile_dtype (an int, so that a wrong code is an error, not undefined behavior) */
  int rank;
  const int64_t* shape; /* rank entries */
} polytile_tensor;

typedef struct polytile_program polytile_program;   /* a parsed, validated Tile program */
typedef struct polytile_compiled polytile_compiled; /* a program compiled for given input types */

/* "0.1.0" */
const char* polytile_version(void);
/* The message of this thread's last failed call ("" when none failed). */
const char* polytile_last_error(void);

polytile_status polytile_parse(const char* text, polytile_program** program);
polytile_status polytile_parse_file(const char* path, polytile_program** program);
/* The program as Tile text; valid until the program is freed. */
const char* polytile_program_text(const polytile_program* program);
size_t polytile_program_input_count(const polytile_program* program);
const char* polytile_program_input(const polytile_program* program, size_t i);
size_t polytile_program_output_count(const polytile_program* program);
const char* polytile_program_output(const polytile_program* program, size_t i);
/* Checks the program for inputs of the given dtypes and shapes (every shape and index rule) without
 * compiling it. */
polytile_status polytile_check(const polytile_program* program, const polytile_tensor* input_types, size_t input_count);
/* Reverse mode: function (inputs..., D<outputs>...) -> (D<wrt>...), the vector-Jacobian products of all
 * outputs with respect to the `wrt_count` inputs named in `wrt` (all inputs when wrt_count is 0). */
polytile_status polytile_gradient(const polytile_program* program, const char* const* wrt, size_t wrt_count,
                                  polytile_program** gradient);
/* Compiles for the CPU ("cpu" or NULL: this machine; "cpu:NAME": the code for the CPU LLVM calls NAME, such
 * as "cpu:x86-64-v3", refused where this machine lacks its instructions; cache sizes after the name, as in
 * "cpu:znver3,l2=512K" or "cpu:host,l1=32K,l2=1M,l3=32M", block it for those caches instead of this
 * machine's) for inputs of the given dtypes and shapes. */
polytile_status polytile_compile(const polytile_program* program, const polytile_tensor* input_types, size_t input_count,
                                 const char* target, polytile_compiled** compiled);
/* An output's dtype and shape; `shape` stays valid until the compiled program is freed. */
polytile_status polytile_output_type(const polytile_compiled* compiled, const char* output, polytile_dtype* dtype, int* rank,
                                     const int64_t** shape);
/* Runs on the caller's memory, nothing copied: every input and every output of the program, by name,
 * of exactly the compiled types; outputs are written in place and must not overlap any other tensor. */
polytile_status polytile_run(const polytile_compiled* compiled, const polytile_tensor* inputs, size_t input_count,
                             const polytile_tensor* outputs, size_t output_count);
void polytile_program_free(polytile_program* program);
void polytile_compiled_free(polytile_compiled* compiled);

#ifdef __cplusplus
}
#endif

#endif
