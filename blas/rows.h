/* rows.h - the rows of each token, in row order: a counting sort of a
 * micro-batch's tokens, shared by the CPU and CUDA backends' encoder
 * backward. Each sums a token's rows of dout in this order and adds the
 * sum to its row of dwte once, so that the two round alike whatever the
 * device (docs/numerics.md).
 */
#ifndef SWARM_BLAS_ROWS_H
#define SWARM_BLAS_ROWS_H

#include <stdint.h>
#include <string.h>

// V: the largest of tokens[0 .. N) + 1 (0 when there are none). Tokens were
// checked against the vocabulary; a negative one is left out here and below.
static inline int blas_token_span(const int32_t *tokens, int N)
{
    int V = 0;
    for (int n = 0; n < N; n++)
        V = tokens[n] >= V ? tokens[n] + 1 : V;
    return V;
}

// rows[offsets[v] .. offsets[v + 1]) are the rows n of token v, in order;
// rows holds N entries, offsets V + 1 (V from blas_token_span).
static inline void blas_token_rows(const int32_t *tokens, int N, int V, int32_t *rows,
                                   int32_t *offsets)
{
    memset(offsets, 0, ((size_t) V + 1) * sizeof(int32_t));
    for (int n = 0; n < N; n++)
        if (tokens[n] >= 0)
            offsets[tokens[n] + 1]++;
    for (int v = 0; v < V; v++)
        offsets[v + 1] += offsets[v];
    for (int n = 0; n < N; n++) // offsets[v] walks to offsets[v + 1] ...
        if (tokens[n] >= 0)
            rows[offsets[tokens[n]]++] = n;
    for (int v = V; v > 0; v--) // ... and is put back
        offsets[v] = offsets[v - 1];
    offsets[0] = 0;
}

#endif
