# ShuffleNet V2's fused downsampling unit (tests/shuffle_unit_kernel.py) as the rules scheduled it
# before kernels v8 (AVX-512's 16 lanes: the tile vectorised over fused image rows, the concat
# kept as a stage): TIR accepted the schedule and FlattenBuffer then failed on it ("T_concat_intermediate
# is used before its definition"). A test fixture for the kernel-by-kernel repair.
# from tvm.script import tirx as T
# from tvm.tirx.layout import Axis

@T.prim_func(private=True, s_tir=True)
def main(p0: T.Buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(24)), "float32"), p1: T.Buffer((T.int64(3), T.int64(3), T.int64(1), T.int64(24)), "float32"), p2: T.Buffer((T.int64(1), T.int64(1), T.int64(24), T.int64(24)), "float32"), p3: T.Buffer((T.int64(1), T.int64(24), T.int64(8), T.int64(8)), "float32"), p4: T.Buffer((T.int64(3), T.int64(3), T.int64(1), T.int64(48)), "float32"), group_conv2d_nhwc_intermediate_1: T.Buffer((T.int64(1), T.int64(4), T.int64(4), T.int64(48)), "float32"), T_transpose_intermediate_1_2_3: T.Buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(48)), "float32")):
    T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
    # with T.sblock("root"):
    pad_temp = T.sblock_alloc_buffer((T.int64(1), T.int64(10), T.int64(10), T.int64(24)))
    group_conv2d_nhwc_intermediate = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(24)))
    conv2d_nhwc_intermediate = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(24)))
    pad_temp_2 = T.sblock_alloc_buffer((T.int64(1), T.int64(10), T.int64(10), T.int64(48)))
    group_conv2d_nhwc_intermediate_local = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(24)), scope="local")
    conv2d_nhwc_intermediate_local = T.sblock_alloc_buffer((T.int64(1), T.int64(8), T.int64(8), T.int64(24)), scope="local")
    group_conv2d_nhwc_intermediate_1_local = T.sblock_alloc_buffer((T.int64(1), T.int64(4), T.int64(4), T.int64(48)), scope="local")
    for ax0_ax1_ax2_0_fused in range(T.int64(300)):
        for ax2_1 in T.vectorized(T.int64(8)):
            with T.sblock("pad_temp"):
                v0 = T.axis.spatial(T.int64(10), ax0_ax1_ax2_0_fused // T.int64(30))
                v1 = T.axis.spatial(T.int64(10), ax0_ax1_ax2_0_fused % T.int64(30) // T.int64(3))
                v2 = T.axis.spatial(T.int64(24), ax0_ax1_ax2_0_fused % T.int64(3) * T.int64(8) + ax2_1)
                T.reads(p0[T.int64(0), v0 + T.int64(-1), v1 + T.int64(-1), v2])
                T.writes(pad_temp[T.int64(0), v0, v1, v2])
                pad_temp[T.int64(0), v0, v1, v2] = T.if_then_else(T.int64(1) <= v0 and v0 < T.int64(9) and T.int64(1) <= v1 and v1 < T.int64(9), p0[T.int64(0), v0 - T.int64(1), v1 - T.int64(1), v2], T.float32(0.0))
    for ax0_ax1_0_ax2_0_fused in range(T.int64(24)):
        for ax1_1_init in T.unroll(T.int64(8)):
            for ax2_1_0_init in T.unroll(T.int64(1)):
                for ax2_1_1_init in T.vectorized(T.int64(8)):
                    with T.sblock("group_conv2d_nhwc_init"):
                        v0 = T.axis.spatial(T.int64(8), ax0_ax1_0_ax2_0_fused // T.int64(3))
                        v1 = T.axis.spatial(T.int64(8), ax1_1_init)
                        v2 = T.axis.spatial(T.int64(24), ax0_ax1_0_ax2_0_fused % T.int64(3) * T.int64(8) + ax2_1_0_init * T.int64(8) + ax2_1_1_init)
                        T.reads()
                        T.writes(group_conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2])
                        group_conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2] = T.float32(0.0)
        for ax3, ax4 in T.grid(T.int64(3), T.int64(3)):
            for ax1_1 in T.unroll(T.int64(8)):
                for ax2_1_0 in T.unroll(T.int64(1)):
                    for ax2_1_1 in T.vectorized(T.int64(8)):
                        with T.sblock("group_conv2d_nhwc_update"):
                            v0 = T.axis.spatial(T.int64(8), ax0_ax1_0_ax2_0_fused // T.int64(3))
                            v1 = T.axis.spatial(T.int64(8), ax1_1)
                            v2 = T.axis.spatial(T.int64(24), ax0_ax1_0_ax2_0_fused % T.int64(3) * T.int64(8) + ax2_1_0 * T.int64(8) + ax2_1_1)
                            v3, v4 = T.axis.remap("RR", [ax3, ax4])
                            T.reads(group_conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2], pad_temp[T.int64(0), v0 + v3, v1 + v4, v2], p1[v3, v4, T.int64(0), v2])
                            T.writes(group_conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2])
                            group_conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2] = group_conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2] + pad_temp[T.int64(0), v0 + v3, v1 + v4, v2] * p1[v3, v4, T.int64(0), v2]
        for ax0 in range(T.int64(8)):
            for ax1 in T.vectorized(T.int64(8)):
                with T.sblock("group_conv2d_nhwc_intermediate_local"):
                    v0 = T.axis.spatial(T.int64(1), T.int64(0))
                    v1 = T.axis.spatial(T.int64(8), ax0_ax1_0_ax2_0_fused // T.int64(3))
                    v2 = T.axis.spatial(T.int64(8), ax0)
                    v3 = T.axis.spatial(T.int64(24), ax0_ax1_0_ax2_0_fused % T.int64(3) * T.int64(8) + ax1)
                    T.reads(group_conv2d_nhwc_intermediate_local[v0, v1, v2, v3])
                    T.writes(group_conv2d_nhwc_intermediate[v0, v1, v2, v3])
                    group_conv2d_nhwc_intermediate[v0, v1, v2, v3] = group_conv2d_nhwc_intermediate_local[v0, v1, v2, v3]
    for ax0_ax1_0_ax2_0_fused in range(T.int64(24)):
        for ax1_1_init in T.unroll(T.int64(8)):
            for ax2_1_0_init in T.unroll(T.int64(1)):
                for ax2_1_1_init in T.vectorized(T.int64(8)):
                    with T.sblock("conv2d_nhwc_init"):
                        v0 = T.axis.spatial(T.int64(8), ax0_ax1_0_ax2_0_fused // T.int64(3))
                        v1 = T.axis.spatial(T.int64(8), ax1_1_init)
                        v2 = T.axis.spatial(T.int64(24), ax0_ax1_0_ax2_0_fused % T.int64(3) * T.int64(8) + ax2_1_0_init * T.int64(8) + ax2_1_1_init)
                        T.reads()
                        T.writes(conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2])
                        conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2] = T.float32(0.0)
        for ax3 in range(T.int64(24)):
            for ax1_1 in T.unroll(T.int64(8)):
                for ax2_1_0 in T.unroll(T.int64(1)):
                    for ax2_1_1 in T.vectorized(T.int64(8)):
                        with T.sblock("conv2d_nhwc_update"):
                            v0 = T.axis.spatial(T.int64(8), ax0_ax1_0_ax2_0_fused // T.int64(3))
                            v1 = T.axis.spatial(T.int64(8), ax1_1)
                            v2 = T.axis.spatial(T.int64(24), ax0_ax1_0_ax2_0_fused % T.int64(3) * T.int64(8) + ax2_1_0 * T.int64(8) + ax2_1_1)
                            v3 = T.axis.reduce(T.int64(24), ax3)
                            T.reads(conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2], group_conv2d_nhwc_intermediate[T.int64(0), v0, v1, v3], p2[T.int64(0), T.int64(0), v3, v2])
                            T.writes(conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2])
                            conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2] = conv2d_nhwc_intermediate_local[T.int64(0), v0, v1, v2] + group_conv2d_nhwc_intermediate[T.int64(0), v0, v1, v3] * p2[T.int64(0), T.int64(0), v3, v2]
        for ax0 in range(T.int64(8)):
            for ax1 in T.vectorized(T.int64(8)):
                with T.sblock("conv2d_nhwc_intermediate_local"):
                    v0 = T.axis.spatial(T.int64(1), T.int64(0))
                    v1 = T.axis.spatial(T.int64(8), ax0_ax1_0_ax2_0_fused // T.int64(3))
                    v2 = T.axis.spatial(T.int64(8), ax0)
                    v3 = T.axis.spatial(T.int64(24), ax0_ax1_0_ax2_0_fused % T.int64(3) * T.int64(8) + ax1)
                    T.reads(conv2d_nhwc_intermediate_local[v0, v1, v2, v3])
                    T.writes(conv2d_nhwc_intermediate[v0, v1, v2, v3])
                    conv2d_nhwc_intermediate[v0, v1, v2, v3] = conv2d_nhwc_intermediate_local[v0, v1, v2, v3]
    for ax0_ax1_ax2_0_fused in range(T.int64(384)):
        for ax2_1 in T.vectorized(T.int64(8)):
            with T.sblock("T_concat"):
                v0 = T.axis.spatial(T.int64(48), ax0_ax1_ax2_0_fused // T.int64(8))
                v1 = T.axis.spatial(T.int64(8), ax0_ax1_ax2_0_fused % T.int64(8))
                v2 = T.axis.spatial(T.int64(8), ax2_1)
                T.reads(conv2d_nhwc_intermediate[T.int64(0), v1, v2, v0 - T.int64(24)], p3[T.int64(0), v0, v1, v2])
                T.writes(T_transpose_intermediate_1_2_3[T.int64(0), v1, v2, v0 % T.int64(24) * T.int64(2) + v0 // T.int64(24)])
                T_transpose_intermediate_1_2_3[T.int64(0), v1, v2, v0 % T.int64(24) * T.int64(2) + v0 // T.int64(24)] = T.if_then_else(T.int64(24) <= v0, T.max(conv2d_nhwc_intermediate[T.int64(0), v1, v2, v0 - T.int64(24)], T.float32(0.0)), p3[T.int64(0), v0, v1, v2])
    for ax0_ax1_ax2_0_fused in range(T.int64(300)):
        for ax2_1 in T.vectorized(T.int64(16)):
            with T.sblock("pad_temp2"):
                v0 = T.axis.spatial(T.int64(10), ax0_ax1_ax2_0_fused // T.int64(30))
                v1 = T.axis.spatial(T.int64(10), ax0_ax1_ax2_0_fused % T.int64(30) // T.int64(3))
                v2 = T.axis.spatial(T.int64(48), ax0_ax1_ax2_0_fused % T.int64(3) * T.int64(16) + ax2_1)
                T_concat_intermediate = T.Buffer((T.int64(1), T.int64(48), T.int64(8), T.int64(8)))
                T.reads(T_concat_intermediate[T.int64(0), v2 % T.int64(2) * T.int64(24) + v2 // T.int64(2), v0 - T.int64(1), v1 - T.int64(1)])
                T.writes(pad_temp_2[T.int64(0), v0, v1, v2])
                pad_temp_2[T.int64(0), v0, v1, v2] = T.if_then_else(T.int64(1) <= v0 and v0 < T.int64(9) and T.int64(1) <= v1 and v1 < T.int64(9), T_concat_intermediate[T.int64(0), v2 % T.int64(2) * T.int64(24) + v2 // T.int64(2), v0 - T.int64(1), v1 - T.int64(1)], T.float32(0.0))
    for ax0_ax1_0_ax2_0_fused in range(T.int64(12)):
        for ax1_1_init in T.unroll(T.int64(4)):
            for ax2_1_0_init in T.unroll(T.int64(1)):
                for ax2_1_1_init in T.vectorized(T.int64(16)):
                    with T.sblock("group_conv2d_nhwc1_init"):
                        v0 = T.axis.spatial(T.int64(4), ax0_ax1_0_ax2_0_fused // T.int64(3))
                        v1 = T.axis.spatial(T.int64(4), ax1_1_init)
                        v2 = T.axis.spatial(T.int64(48), ax0_ax1_0_ax2_0_fused % T.int64(3) * T.int64(16) + ax2_1_0_init * T.int64(16) + ax2_1_1_init)
                        T.reads()
                        T.writes(group_conv2d_nhwc_intermediate_1_local[T.int64(0), v0, v1, v2])
                        group_conv2d_nhwc_intermediate_1_local[T.int64(0), v0, v1, v2] = T.float32(0.0)
        for ax3, ax4 in T.grid(T.int64(3), T.int64(3)):
            for ax1_1 in T.unroll(T.int64(4)):
                for ax2_1_0 in T.unroll(T.int64(1)):
                    for ax2_1_1 in T.vectorized(T.int64(16)):
                        with T.sblock("group_conv2d_nhwc1_update"):
                            v0 = T.axis.spatial(T.int64(4), ax0_ax1_0_ax2_0_fused // T.int64(3))
                            v1 = T.axis.spatial(T.int64(4), ax1_1)
                            v2 = T.axis.spatial(T.int64(48), ax0_ax1_0_ax2_0_fused % T.int64(3) * T.int64(16) + ax2_1_0 * T.int64(16) + ax2_1_1)
                            v3, v4 = T.axis.remap("RR", [ax3, ax4])
                            T.reads(group_conv2d_nhwc_intermediate_1_local[T.int64(0), v0, v1, v2], pad_temp_2[T.int64(0), v0 * T.int64(2) + v3, v1 * T.int64(2) + v4, v2], p4[v3, v4, T.int64(0), v2])
                            T.writes(group_conv2d_nhwc_intermediate_1_local[T.int64(0), v0, v1, v2])
                            group_conv2d_nhwc_intermediate_1_local[T.int64(0), v0, v1, v2] = group_conv2d_nhwc_intermediate_1_local[T.int64(0), v0, v1, v2] + pad_temp_2[T.int64(0), v0 * T.int64(2) + v3, v1 * T.int64(2) + v4, v2] * p4[v3, v4, T.int64(0), v2]
        for ax0 in range(T.int64(4)):
            for ax1 in T.vectorized(T.int64(16)):
                with T.sblock("group_conv2d_nhwc_intermediate_1_local"):
                    v0 = T.axis.spatial(T.int64(1), T.int64(0))
                    v1 = T.axis.spatial(T.int64(4), ax0_ax1_0_ax2_0_fused // T.int64(3))
                    v2 = T.axis.spatial(T.int64(4), ax0)
                    v3 = T.axis.spatial(T.int64(48), ax0_ax1_0_ax2_0_fused % T.int64(3) * T.int64(16) + ax1)
                    T.reads(group_conv2d_nhwc_intermediate_1_local[v0, v1, v2, v3])
                    T.writes(group_conv2d_nhwc_intermediate_1[v0, v1, v2, v3])
                    group_conv2d_nhwc_intermediate_1[v0, v1, v2, v3] = group_conv2d_nhwc_intermediate_1_local[v0, v1, v2, v3]
