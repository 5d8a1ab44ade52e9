/*
 * ops/oplist.h - the one list of operator descriptors (an X-macro).
 *
 * Every zsi_opdef of the library is named here, so the table exists
 * before the first call: a backend registers its kernels by (operator,
 * device, dtype) at start-up (zsi_op_set_kernel on zsi_opdefs()), and
 * `zs ops` prints what runs where. A new operator is a definition in its
 * file plus one line here, in its file's group.
 *
 * Use: #define ZSI_OP(sym) ... then #include "ops/oplist.h" (the macro is
 * undefined at the end). With no ZSI_OP defined, it declares them all.
 */
#ifndef ZSI_OP
#define ZSI_OP(sym) extern zsi_opdef sym;
#endif
/* attention.c */
ZSI_OP(zsi_def_attention)
ZSI_OP(zsi_def_attention_backward)
/* binary.c */
ZSI_OP(zsi_def_add)
ZSI_OP(zsi_def_add_scalar)
ZSI_OP(zsi_def_div)
ZSI_OP(zsi_def_mul)
ZSI_OP(zsi_def_mul_scalar)
ZSI_OP(zsi_def_sub)
/* conv.c */
ZSI_OP(zsi_def_conv2d)
ZSI_OP(zsi_def_conv2d_backward)
/* dropout.c */
ZSI_OP(zsi_def_dropout)
ZSI_OP(zsi_def_dropout_backward)
/* embedding.c */
ZSI_OP(zsi_def_embedding)
ZSI_OP(zsi_def_embedding_backward)
/* fp8.c */
ZSI_OP(zsi_def_fp8_dequantize)
ZSI_OP(zsi_def_fp8_gemm)
ZSI_OP(zsi_def_fp8_quantize)
ZSI_OP(zsi_def_linear_fp8)
/* infer_ops.c */
ZSI_OP(zsi_def_embedding_rows)
ZSI_OP(zsi_def_gather_rows)
ZSI_OP(zsi_def_kv_store)
ZSI_OP(zsi_def_layer_norm_rows)
ZSI_OP(zsi_def_packed_linear)
ZSI_OP(zsi_def_paged_attention)
/* inplace.c */
ZSI_OP(zsi_def_axpy_)
ZSI_OP(zsi_def_copy_)
ZSI_OP(zsi_def_fill_)
ZSI_OP(zsi_def_scale_)
/* join.c */
ZSI_OP(zsi_def_concat)
/* linear.c */
ZSI_OP(zsi_def_linear)
ZSI_OP(zsi_def_linear_gelu)
ZSI_OP(zsi_def_linear_res)
ZSI_OP(zsi_def_linear_gelu_backward)
/* loss.c */
ZSI_OP(zsi_def_cross_entropy)
ZSI_OP(zsi_def_cross_entropy_backward)
ZSI_OP(zsi_def_mse)
ZSI_OP(zsi_def_row_lse)
ZSI_OP(zsi_def_cross_entropy_shard)
/* matmul.c */
ZSI_OP(zsi_def_matmul)
ZSI_OP(zsi_def_matmul_acc_)
/* norm.c */
ZSI_OP(zsi_def_batch_norm)
ZSI_OP(zsi_def_batch_norm_backward)
ZSI_OP(zsi_def_layer_norm)
ZSI_OP(zsi_def_layer_norm_backward)
/* optim_update.c */
ZSI_OP(zsi_def_adam_update)
ZSI_OP(zsi_def_sgd_update)
ZSI_OP(zsi_def_sum_squares)
ZSI_OP(zsi_def_adam_update_dyn)
ZSI_OP(zsi_def_sgd_update_dyn)
ZSI_OP(zsi_def_clip_coef)
/* pool.c */
ZSI_OP(zsi_def_avg_pool)
ZSI_OP(zsi_def_avg_pool_backward)
ZSI_OP(zsi_def_max_pool)
ZSI_OP(zsi_def_max_pool_backward)
/* reduce.c */
ZSI_OP(zsi_def_mean)
ZSI_OP(zsi_def_sum)
/* reduce_ext.c */
ZSI_OP(zsi_def_argmax)
ZSI_OP(zsi_def_max)
ZSI_OP(zsi_def_max_backward)
ZSI_OP(zsi_def_var)
/* select.c */
ZSI_OP(zsi_def_gather)
ZSI_OP(zsi_def_gather_backward)
ZSI_OP(zsi_def_index_select)
ZSI_OP(zsi_def_index_select_backward)
ZSI_OP(zsi_def_masked_fill)
ZSI_OP(zsi_def_where)
/* softmax.c */
ZSI_OP(zsi_def_log_softmax)
ZSI_OP(zsi_def_log_softmax_backward)
ZSI_OP(zsi_def_softmax)
ZSI_OP(zsi_def_softmax_backward)
/* sparse_attention.c */
ZSI_OP(zsi_def_sparse_attention)
ZSI_OP(zsi_def_sparse_attention_backward)
/* unary.c */
ZSI_OP(zsi_def_abs)
ZSI_OP(zsi_def_clamp)
ZSI_OP(zsi_def_cos)
ZSI_OP(zsi_def_deriv)
ZSI_OP(zsi_def_exp)
ZSI_OP(zsi_def_gelu)
ZSI_OP(zsi_def_log)
ZSI_OP(zsi_def_neg)
ZSI_OP(zsi_def_pow)
ZSI_OP(zsi_def_relu)
ZSI_OP(zsi_def_rsqrt)
ZSI_OP(zsi_def_sigmoid)
ZSI_OP(zsi_def_silu)
ZSI_OP(zsi_def_sin)
ZSI_OP(zsi_def_sqrt)
ZSI_OP(zsi_def_tanh)
/* unscale.c */
ZSI_OP(zsi_def_unscale_)
/* views.c */
ZSI_OP(zsi_def_copy)
ZSI_OP(zsi_def_expand)
ZSI_OP(zsi_def_hook)
ZSI_OP(zsi_def_permute)
ZSI_OP(zsi_def_slice)
ZSI_OP(zsi_def_slice_backward)
ZSI_OP(zsi_def_squeeze)
ZSI_OP(zsi_def_to_dtype)
ZSI_OP(zsi_def_unsqueeze)
ZSI_OP(zsi_def_view)
/* parallel/tp.c (tensor-parallel communication). The one exception to
 * "arrows point down": these descriptors live in the parallel layer,
 * because their kernels are the communicator's collectives, and are listed
 * here so that the table, `zs ops` and the test device see every operator
 * from the start. Moving them into ops would need the collectives
 * installed as their kernels at run time (as a backend installs its own);
 * not done yet. */
ZSI_OP(zsi_def_tp_allgather)
ZSI_OP(zsi_def_tp_allreduce)
ZSI_OP(zsi_def_tp_copy)
ZSI_OP(zsi_def_tp_reduce_scatter)
ZSI_OP(zsi_def_tp_split)
#undef ZSI_OP
