# A small Relax module in TVMScript: used by the tests, and as an example of a TVMScript model.
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class Module:
    @R.function
    def main(
        x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float32")
    ) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            a = R.matmul(x, w)
            b = R.nn.relu(a)
            c = R.sum(b, axis=[1], keepdims=True)
            d = R.divide(b, c)
            e = R.exp(x)
            f = R.add(d, e)
            g = R.multiply(x, x)
            h = R.add(f, g)
            R.output(h)
        return h
