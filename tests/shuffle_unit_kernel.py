# ShuffleNet V2's fused downsampling unit (dwconv + 1x1 conv + concat + channel shuffle + the next
# unit's dwconv), as FuseTIR made it: register-tiled by the rules it does not lower. A test fixture.
# from tvm.script import tirx as T
# from tvm.tirx.layout import Axis

@T.prim_func(private=True, s_tir=True)
def main(p0: T.Buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(24)), "float32"), p1: T.Buffer((T.int64(3), T.int64(3), T.int64(1), T.int64(24)), "float32"), p2: T.Buffer((T.int64(1), T.int64(1), T.int64(24), T.int64(24)), "float32"), p3: T.Buffer((T.int64(1), T.int64(24), T.int64(8), T.int64(8)), "float32"), p4: T.Buffer((T.int64(3), T.int64(3), T.int64(1), T.int64(48)), "float32"), group_conv2d_nhwc_intermediate_1: T.Buffer((T.int64(1), T.int64(4), T.int64(4), T.int64(48)), "float32"), T_transpose_intermediate_1_2_3: T.Buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(48)), "float32")):
    T.func_attr({"tirx.noalias": True})
    # with T.sblock("root"):
    pad_temp = T.sblock_alloc_buffer((T.int64(1), T.int64(10), T.int64(10), T.int64(24)))
    group_conv2d_nhwc_intermediate = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(24)))
    pad_temp_1 = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(24)))
    conv2d_nhwc_intermediate = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(24)))
    compute_intermediate = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(24)))
    T_transpose_intermediate = T.sblock_alloc_buffer((T.int64(1), T.int64(24), T.int64(8), T.int64(8)))
    T_concat_intermediate = T.sblock_alloc_buffer((T.int64(1), T.int64(48), T.int64(8), T.int64(8)))
    T_reshape_intermediate = T.sblock_alloc_buffer((T.int64(1), T.int64(2), T.int64(24), T.int64(8), T.int64(8)))
    T_transpose_intermediate_1 = T.sblock_alloc_buffer((T.int64(1), T.int64(24), T.int64(2), T.int64(8), T.int64(8)))
    T_reshape_intermediate_1 = T.sblock_alloc_buffer((T.int64(1), T.int64(48), T.int64(8), T.int64(8)))
    T_transpose_intermediate_1_2 = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(48)))
    pad_temp_2 = T.sblock_alloc_buffer((T.int64(1), T.int64(10), T.int64(10), T.int64(48)))
    for i0, i1, i2, i3 in T.grid(T.int64(1), T.int64(10), T.int64(10), T.int64(24)):
        with T.sblock("pad_temp"):
            v_i0, v_i1, v_i2, v_i3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
            T.reads(p0[v_i0, v_i1 - T.int64(1), v_i2 - T.int64(1), v_i3])
            T.writes(pad_temp[v_i0, v_i1, v_i2, v_i3])
            pad_temp[v_i0, v_i1, v_i2, v_i3] = T.if_then_else(T.int64(1) <= v_i1 and v_i1 < T.int64(9) and T.int64(1) <= v_i2 and v_i2 < T.int64(9), p0[v_i0, v_i1 - T.int64(1), v_i2 - T.int64(1), v_i3], T.float32(0.0))
    for nn, yy, xx, ff, ry, rx, rc in T.grid(T.int64(1), T.int64(8), T.int64(8), T.int64(24), T.int64(3), T.int64(3), T.int64(1)):
        with T.sblock("group_conv2d_nhwc"):
            v_nn, v_yy, v_xx, v_ff, v_ry, v_rx, v_rc = T.axis.remap("SSSSRRR", [nn, yy, xx, ff, ry, rx, rc])
            T.reads(pad_temp[v_nn, v_yy + v_ry, v_xx + v_rx, v_ff + v_rc], p1[v_ry, v_rx, v_rc, v_ff])
            T.writes(group_conv2d_nhwc_intermediate[v_nn, v_yy, v_xx, v_ff])
            with T.init():
                group_conv2d_nhwc_intermediate[v_nn, v_yy, v_xx, v_ff] = T.float32(0.0)
            group_conv2d_nhwc_intermediate[v_nn, v_yy, v_xx, v_ff] = group_conv2d_nhwc_intermediate[v_nn, v_yy, v_xx, v_ff] + pad_temp[v_nn, v_yy + v_ry, v_xx + v_rx, v_ff + v_rc] * p1[v_ry, v_rx, v_rc, v_ff]
    for i0, i1, i2, i3 in T.grid(T.int64(1), T.int64(8), T.int64(8), T.int64(24)):
        with T.sblock("pad_temp1"):
            v_i0, v_i1, v_i2, v_i3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
            T.reads(group_conv2d_nhwc_intermediate[v_i0, v_i1, v_i2, v_i3])
            T.writes(pad_temp_1[v_i0, v_i1, v_i2, v_i3])
            pad_temp_1[v_i0, v_i1, v_i2, v_i3] = group_conv2d_nhwc_intermediate[v_i0, v_i1, v_i2, v_i3]
    for nn, yy, xx, ff, ry, rx, rc in T.grid(T.int64(1), T.int64(8), T.int64(8), T.int64(24), T.int64(1), T.int64(1), T.int64(24)):
        with T.sblock("conv2d_nhwc"):
            v_nn, v_yy, v_xx, v_ff, v_ry, v_rx, v_rc = T.axis.remap("SSSSRRR", [nn, yy, xx, ff, ry, rx, rc])
            T.reads(pad_temp_1[v_nn, v_yy + v_ry, v_xx + v_rx, v_rc], p2[v_ry, v_rx, v_rc, v_ff])
            T.writes(conv2d_nhwc_intermediate[v_nn, v_yy, v_xx, v_ff])
            with T.init():
                conv2d_nhwc_intermediate[v_nn, v_yy, v_xx, v_ff] = T.float32(0.0)
            conv2d_nhwc_intermediate[v_nn, v_yy, v_xx, v_ff] = conv2d_nhwc_intermediate[v_nn, v_yy, v_xx, v_ff] + pad_temp_1[v_nn, v_yy + v_ry, v_xx + v_rx, v_rc] * p2[v_ry, v_rx, v_rc, v_ff]
    for i0, i1, i2, i3 in T.grid(T.int64(1), T.int64(8), T.int64(8), T.int64(24)):
        with T.sblock("compute"):
            v_i0, v_i1, v_i2, v_i3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
            T.reads(conv2d_nhwc_intermediate[v_i0, v_i1, v_i2, v_i3])
            T.writes(compute_intermediate[v_i0, v_i1, v_i2, v_i3])
            compute_intermediate[v_i0, v_i1, v_i2, v_i3] = T.max(conv2d_nhwc_intermediate[v_i0, v_i1, v_i2, v_i3], T.float32(0.0))
    for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(24), T.int64(8), T.int64(8)):
        with T.sblock("T_transpose"):
            v_ax0, v_ax1, v_ax2, v_ax3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
            T.reads(compute_intermediate[v_ax0, v_ax2, v_ax3, v_ax1])
            T.writes(T_transpose_intermediate[v_ax0, v_ax1, v_ax2, v_ax3])
            T_transpose_intermediate[v_ax0, v_ax1, v_ax2, v_ax3] = compute_intermediate[v_ax0, v_ax2, v_ax3, v_ax1]
    for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(48), T.int64(8), T.int64(8)):
        with T.sblock("T_concat"):
            v_ax0, v_ax1, v_ax2, v_ax3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
            T.reads(T_transpose_intermediate[v_ax0, v_ax1 - T.int64(24), v_ax2, v_ax3], p3[v_ax0, v_ax1, v_ax2, v_ax3])
            T.writes(T_concat_intermediate[v_ax0, v_ax1, v_ax2, v_ax3])
            T_concat_intermediate[v_ax0, v_ax1, v_ax2, v_ax3] = T.if_then_else(T.int64(24) <= v_ax1, T_transpose_intermediate[v_ax0, v_ax1 - T.int64(24), v_ax2, v_ax3], p3[v_ax0, v_ax1, v_ax2, v_ax3])
    for ax0, ax1, ax2, ax3, ax4 in T.grid(T.int64(1), T.int64(2), T.int64(24), T.int64(8), T.int64(8)):
        with T.sblock("T_reshape"):
            v_ax0, v_ax1, v_ax2, v_ax3, v_ax4 = T.axis.remap("SSSSS", [ax0, ax1, ax2, ax3, ax4])
            T.reads(T_concat_intermediate[T.int64(0), (v_ax1 * T.int64(24) + (v_ax4 // T.int64(8) + v_ax3) // T.int64(8) + v_ax2) % T.int64(48), (v_ax4 // T.int64(8) + v_ax3) % T.int64(8), v_ax4 % T.int64(8)])
            T.writes(T_reshape_intermediate[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4])
            T_reshape_intermediate[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4] = T_concat_intermediate[T.int64(0), (v_ax1 * T.int64(24) + (v_ax4 // T.int64(8) + v_ax3) // T.int64(8) + v_ax2) % T.int64(48), (v_ax4 // T.int64(8) + v_ax3) % T.int64(8), v_ax4 % T.int64(8)]
    for ax0, ax1, ax2, ax3, ax4 in T.grid(T.int64(1), T.int64(24), T.int64(2), T.int64(8), T.int64(8)):
        with T.sblock("T_transpose1"):
            v_ax0, v_ax1, v_ax2, v_ax3, v_ax4 = T.axis.remap("SSSSS", [ax0, ax1, ax2, ax3, ax4])
            T.reads(T_reshape_intermediate[v_ax0, v_ax2, v_ax1, v_ax3, v_ax4])
            T.writes(T_transpose_intermediate_1[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4])
            T_transpose_intermediate_1[v_ax0, v_ax1, v_ax2, v_ax3, v_ax4] = T_reshape_intermediate[v_ax0, v_ax2, v_ax1, v_ax3, v_ax4]
    for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(48), T.int64(8), T.int64(8)):
        with T.sblock("T_reshape1"):
            v_ax0, v_ax1, v_ax2, v_ax3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
            T.reads(T_transpose_intermediate_1[T.int64(0), ((v_ax3 // T.int64(8) + v_ax2) // T.int64(8) + v_ax1) % T.int64(48) // T.int64(2), ((v_ax3 // T.int64(8) + v_ax2) // T.int64(8) + v_ax1) % T.int64(2), (v_ax3 // T.int64(8) + v_ax2) % T.int64(8), v_ax3 % T.int64(8)])
            T.writes(T_reshape_intermediate_1[v_ax0, v_ax1, v_ax2, v_ax3])
            T_reshape_intermediate_1[v_ax0, v_ax1, v_ax2, v_ax3] = T_transpose_intermediate_1[T.int64(0), ((v_ax3 // T.int64(8) + v_ax2) // T.int64(8) + v_ax1) % T.int64(48) // T.int64(2), ((v_ax3 // T.int64(8) + v_ax2) // T.int64(8) + v_ax1) % T.int64(2), (v_ax3 // T.int64(8) + v_ax2) % T.int64(8), v_ax3 % T.int64(8)]
    for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(8), T.int64(8), T.int64(48)):
        with T.sblock("T_transpose2"):
            v_ax0, v_ax1, v_ax2, v_ax3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
            T.reads(T_reshape_intermediate_1[v_ax0, v_ax3, v_ax1, v_ax2])
            T.writes(T_transpose_intermediate_1_2[v_ax0, v_ax1, v_ax2, v_ax3])
            T_transpose_intermediate_1_2[v_ax0, v_ax1, v_ax2, v_ax3] = T_reshape_intermediate_1[v_ax0, v_ax3, v_ax1, v_ax2]
    for i0, i1, i2, i3 in T.grid(T.int64(1), T.int64(10), T.int64(10), T.int64(48)):
        with T.sblock("pad_temp2"):
            v_i0, v_i1, v_i2, v_i3 = T.axis.remap("SSSS", [i0, i1, i2, i3])
            T.reads(T_transpose_intermediate_1_2[v_i0, v_i1 - T.int64(1), v_i2 - T.int64(1), v_i3])
            T.writes(pad_temp_2[v_i0, v_i1, v_i2, v_i3])
            pad_temp_2[v_i0, v_i1, v_i2, v_i3] = T.if_then_else(T.int64(1) <= v_i1 and v_i1 < T.int64(9) and T.int64(1) <= v_i2 and v_i2 < T.int64(9), T_transpose_intermediate_1_2[v_i0, v_i1 - T.int64(1), v_i2 - T.int64(1), v_i3], T.float32(0.0))
    for nn, yy, xx, ff, ry, rx, rc in T.grid(T.int64(1), T.int64(4), T.int64(4), T.int64(48), T.int64(3), T.int64(3), T.int64(1)):
        with T.sblock("group_conv2d_nhwc1"):
            v_nn, v_yy, v_xx, v_ff, v_ry, v_rx, v_rc = T.axis.remap("SSSSRRR", [nn, yy, xx, ff, ry, rx, rc])
            T.reads(pad_temp_2[v_nn, v_yy * T.int64(2) + v_ry, v_xx * T.int64(2) + v_rx, v_ff + v_rc], p4[v_ry, v_rx, v_rc, v_ff])
            T.writes(group_conv2d_nhwc_intermediate_1[v_nn, v_yy, v_xx, v_ff])
            with T.init():
                group_conv2d_nhwc_intermediate_1[v_nn, v_yy, v_xx, v_ff] = T.float32(0.0)
            group_conv2d_nhwc_intermediate_1[v_nn, v_yy, v_xx, v_ff] = group_conv2d_nhwc_intermediate_1[v_nn, v_yy, v_xx, v_ff] + pad_temp_2[v_nn, v_yy * T.int64(2) + v_ry, v_xx * T.int64(2) + v_rx, v_ff + v_rc] * p4[v_ry, v_rx, v_rc, v_ff]
    for ax0, ax1, ax2, ax3 in T.grid(T.int64(1), T.int64(8), T.int64(8), T.int64(48)):
        with T.sblock("T_transpose3"):
            v_ax0, v_ax1, v_ax2, v_ax3 = T.axis.remap("SSSS", [ax0, ax1, ax2, ax3])
            T.reads(T_reshape_intermediate_1[v_ax0, v_ax3, v_ax1, v_ax2])
            T.writes(T_transpose_intermediate_1_2_3[v_ax0, v_ax1, v_ax2, v_ax3])
            T_transpose_intermediate_1_2_3[v_ax0, v_ax1, v_ax2, v_ax3] = T_reshape_intermediate_1[v_ax0, v_ax3, v_ax1, v_ax2]