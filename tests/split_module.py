# A Relax module with a tuple-output kernel (split) whose results are indexed: a test model.
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4, 12), "float32")) -> R.Tensor((4, 4), "float32"):
        with R.dataflow():
            a = R.multiply(x, R.const(2.0, "float32"))
            s = R.split(a, 3, axis=1)
            b = R.add(s[0], s[1])
            c = R.exp(s[2])
            d = R.add(b, c)
            R.output(d)
        return d
