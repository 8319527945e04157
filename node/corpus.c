/* corpus.c - access to the default corpus that corpus.S builds into the
 * binary (swarm's own documentation and sources). */
#include "node.h"

extern const uint8_t swarm_corpus_start[];
extern const uint8_t swarm_corpus_end[];

const uint8_t *node_corpus(size_t *n)
{
    *n = (size_t) (swarm_corpus_end - swarm_corpus_start);
    return swarm_corpus_start;
}
