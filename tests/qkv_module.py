# A Relax module with GPT-2's fused QKV projection: a matmul whose output is split three ways
# (DLight's Matmul rule schedules matmul+split kernels into TIR that fails to lower).
import numpy as np
from tvm.script import ir as I
from tvm.script import relax as R

W = np.random.default_rng(0).standard_normal((32, 96)).astype("float32") * 0.1


@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 16, 32), "float32")) -> R.Tensor((1, 16, 32), "float32"):
        with R.dataflow():
            a = R.matmul(x, R.const(W))
            s = R.split(a, 3, axis=2)
            q = R.multiply(s[0], s[1])
            d = R.add(q, s[2])
            R.output(d)
        return d
