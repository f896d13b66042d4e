"""polytile: tensor operations written as Tile contractions, differentiated, made efficient with
reduce/defract, scheduled with isl and compiled with LLVM.

    import numpy as np, polytile
    conv = polytile.Program('''
        function (I[N, H, W, CI], K[KH, KW, CI, CO]) -> (O) {
          O[n, y, x, co : N, H/3, W/3, CO] = +(I[n, 3*y + 2*j, 3*x + 2*i, ci] * K[j, i, ci, co]);
        }''')
    print(conv.grad(wrt="I"))                       # reduced and defracted
    f = conv.compile(I=((8, 57, 57, 32), "f32"), K=((2, 2, 32, 64), "f32"))
    O = f(I, K)                                      # numpy in, numpy out; I and K used in place

Arrays go in through DLPack (numpy, PyTorch, JAX: anything with ``__dlpack__``, or the buffer
protocol) and are used in place, never copied: they must be on the CPU, C-contiguous and of the
compiled dtype and shape, or the call raises :class:`Error` naming the argument. User errors (bad
text, shapes, arguments) raise :class:`Error`, a ``ValueError`` carrying the command line's message.
"""

import numpy as np

from . import _polytile as _ext
from ._polytile import Error, InternalError, __version__

__all__ = ["Program", "Compiled", "Error", "InternalError", "stages", "__version__"]

_DTYPES = {"f16": "float16", "f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64", "bool": "bool"}
_NAMES = {v: k for k, v in _DTYPES.items()}


def _empty_aligned(shape, dtype):
    """An uninitialized C-ordered array whose data starts on a 64-byte cache line (numpy's own start 16
    bytes in): the compiled code's 64-byte vector stores then never straddle two lines."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def stages():
    """The stages :meth:`Program.lower` prints, in pipeline order."""
    return list(_ext.stages())


def _dtype_name(tensor, dtype):
    """polytile's name ("f32", ...) of a dtype given as a polytile name, a numpy dtype or type, or a
    framework's dtype object (torch.float32, jnp.float32)."""
    if isinstance(dtype, str) and dtype in _DTYPES:
        return dtype
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = str(dtype).rsplit(".", 1)[-1]  # torch.float32 -> float32
    if name not in _NAMES:
        raise Error(f"tensor {tensor}: dtype {name} is not one polytile computes in ({', '.join(_DTYPES)})")
    return _NAMES[name]


def _type_of(tensor, spec):
    """(shape, dtype name) from an array (anything with .shape and .dtype), a (shape, dtype) pair or a
    shape alone (f32)."""
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):
        shape, dtype = spec.shape, spec.dtype
    elif isinstance(spec, tuple) and len(spec) == 2 and not isinstance(spec[1], int):
        shape, dtype = spec
    elif isinstance(spec, (tuple, list)):
        shape, dtype = spec, "f32"
    else:
        raise Error(f"tensor {tensor}: expected an array, a (shape, dtype) pair or a shape, got {type(spec).__name__}")
    try:
        dims = [int(d) for d in shape]
    except (TypeError, ValueError):
        raise Error(f"tensor {tensor}: the shape {shape!r} is not a sequence of integers") from None
    return dims, _dtype_name(tensor, dtype)


def _types(types):
    return {name: _type_of(name, spec) for name, spec in types.items()}


class Program:
    """A parsed and validated Tile program (``function (inputs) -> (outputs) { ... }``)."""

    def __init__(self, text):
        if isinstance(text, _ext.Program):
            self._program = text
        elif isinstance(text, str):
            self._program = _ext.Program.parse(text)
        else:
            raise Error(f"Program: expected Tile text (a str), got {type(text).__name__}")

    @classmethod
    def from_file(cls, path):
        """The program in a .tile file."""
        return cls(_ext.Program.parse_file(str(path)))

    @property
    def text(self):
        """The program as Tile text (parses back to the same program)."""
        return self._program.text()

    @property
    def inputs(self):
        return list(self._program.inputs())

    @property
    def outputs(self):
        return list(self._program.outputs())

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"polytile.Program({', '.join(self.inputs)} -> {', '.join(self.outputs)})"

    def types(self, **inputs):
        """Every tensor's (shape, dtype name) for inputs of the given types."""
        return {name: (tuple(shape), dtype) for name, (shape, dtype) in self._program.types(_types(inputs)).items()}

    def grad(self, wrt=None, mode="reverse", reduce_and_defract=True, verify=False, keep_zero_adjoints=False):
        """The gradient program. Reverse (and mixed) mode: ``function (inputs..., D<outputs>...) ->
        (D<wrt>...)``, the vector-Jacobian products; forward mode: the Jacobian-vector products.
        ``wrt`` is an input name or a list of them (default: every input); ``reduce_and_defract=False``
        gives the gradient as generated, before the lattice passes; ``verify`` proves every rewrite.
        Tensors the outputs provably do not depend on (softmax's row maxima) get no adjoint (tangent)
        statements; ``keep_zero_adjoints=True`` computes them as the rules write them."""
        names = [wrt] if isinstance(wrt, str) else list(wrt or [])
        return Program(self._program.grad(names, mode, reduce_and_defract, verify, keep_zero_adjoints))

    def lower(self, stage, target=None, verify=False, **types):
        """The text of one compiler stage (see :func:`stages`): tile, isl, reduced, defracted, lowered,
        schedule, ast, loops, llvm, ptx. From isl on, give every input's type as a keyword argument
        (an array, a (shape, dtype) pair or a shape). ``target``: "cpu" (this machine), "cpu:NAME" (what
        is made for the CPU LLVM calls NAME, e.g. "cpu:x86-64-v3"; cache sizes may follow the name,
        "cpu:znver3,l2=512K", for a machine whose caches differ from this one's) or a GPU, "sm_XY"."""
        return self._program.lower(stage, _types(types), target or "", verify)

    def compile(self, target="cpu", threads=0, verify=False, **types):
        """Compiles for inputs of the given types (keyword arguments: an array, a (shape, dtype) pair
        or a shape) and returns a :class:`Compiled` callable. ``threads=0`` uses every core.
        ``target="cpu:NAME"`` makes the code for the CPU LLVM calls NAME ("znver3", "x86-64-v3": AVX2
        code on an AVX-512 machine); one with instructions this machine lacks is refused. Cache sizes
        after the name ("cpu:host,l1=32K,l2=1M,l3=32M": bytes, or K, M, G) block the code for them."""
        return Compiled(self._program.compile(_types(types), target, int(threads), verify))

    def interpret(self, *args, **kwargs):
        """Runs the reference interpreter (the semantics' definition, slow) on copies of the inputs;
        returns the outputs like :class:`Compiled` does."""
        inputs = _bind(self.inputs, args, kwargs, "interpret")
        result = self._program.interpret(inputs)
        outs = tuple(result[o] for o in self.outputs)
        return outs[0] if len(outs) == 1 else outs


def _bind(names, args, kwargs, what):
    """The arguments by name: positional in the program's order, then keywords."""
    if len(args) > len(names):
        raise Error(f"{what}: the program takes {len(names)} inputs ({', '.join(names)}), got {len(args)}")
    bound = dict(zip(names, args))
    for name, value in kwargs.items():
        if name not in names:
            raise Error(f"{what}: the program has no input {name} (inputs: {', '.join(names)})")
        if name in bound:
            raise Error(f"{what}: input {name} is given twice")
        bound[name] = value
    missing = [n for n in names if n not in bound]
    if missing:
        raise Error(f"{what}: input {missing[0]} is missing")
    return bound


class Compiled:
    """A program compiled for given input types. Call it with the inputs (positional in the program's
    order, or by name) to get the outputs: one array, or a tuple in the program's order. ``out=`` (an
    array, or a tuple or dict of them) writes into the caller's arrays instead of new numpy arrays.
    Calls may come from several threads at once (the GIL is released while the code runs) as long as
    their outputs do not overlap."""

    def __init__(self, compiled):
        self._compiled = compiled
        self.inputs = list(compiled.inputs)
        self.outputs = list(compiled.outputs)
        # Read once: every call without out= allocates from them.
        self._input_types = {n: (tuple(s), d) for n, (s, d) in compiled.input_types().items()}
        self._output_types = {n: (tuple(s), d) for n, (s, d) in compiled.output_types().items()}

    @property
    def input_types(self):
        return dict(self._input_types)

    @property
    def output_types(self):
        """Each output's (shape, dtype name)."""
        return dict(self._output_types)

    @property
    def last_binding(self):
        """The data pointers the last call ran on, by tensor name (the caller's arrays' own)."""
        return dict(self._compiled.last_binding())

    @property
    def llvm_ir(self):
        """The optimized LLVM IR of the program (deterministic)."""
        return self._compiled.llvm_ir()

    def __call__(self, *args, out=None, **kwargs):
        bound = _bind(self.inputs, args, kwargs, "run")
        outs = self._outputs(out)
        self._compiled.run([bound[n] for n in self.inputs], [outs[n] for n in self.outputs])
        result = tuple(outs[n] for n in self.outputs)
        return result[0] if len(result) == 1 else result

    def _outputs(self, out):
        if out is None:
            return {n: _empty_aligned(s, _DTYPES[d]) for n, (s, d) in self._output_types.items()}
        if isinstance(out, dict):
            unknown = [n for n in out if n not in self.outputs]
            if unknown:
                raise Error(f"run: the program has no output {unknown[0]} (outputs: {', '.join(self.outputs)})")
            missing = [n for n in self.outputs if n not in out]
            if missing:
                raise Error(f"run: out= lacks output {missing[0]}")
            return dict(out)
        given = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(given) != len(self.outputs):
            raise Error(f"run: the program writes {len(self.outputs)} outputs ({', '.join(self.outputs)}), out= has {len(given)}")
        return dict(zip(self.outputs, given))
