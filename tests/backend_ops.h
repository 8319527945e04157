/* backend_ops.h - the test every backend's table passes: no op is NULL
 * (check_blas for the CPU, check_cuda for the CUDA plugin).
 */
#ifndef SWARM_TESTS_BACKEND_OPS_H
#define SWARM_TESTS_BACKEND_OPS_H

#include "blas.h"

#include <check.h>

static void s_assert_every_op(const blas_backend_t *be)
{
    const void *ops[] = {
        (const void *) be->buf_alloc, (const void *) be->buf_free, (const void *) be->upload,
        (const void *) be->download, (const void *) be->zero, (const void *) be->sync,
        (const void *) be->encoder_forward, (const void *) be->encoder_backward,
        (const void *) be->layernorm_forward, (const void *) be->layernorm_backward,
        (const void *) be->matmul_forward, (const void *) be->matmul_backward,
        (const void *) be->attention_forward, (const void *) be->attention_backward,
        (const void *) be->gelu_forward, (const void *) be->gelu_backward,
        (const void *) be->add, (const void *) be->crossentropy, (const void *) be->sumsq,
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        ck_assert_msg(ops[i] != NULL, "op %zu of the table is NULL", i);
}

#endif
