/* corpus.S - the default training corpus built into the binary: swarm's own
 * documentation and sources (see CORPUS_FILES in the Makefile), so that
 * `swarm train` and `make demo` need no data file. */
    .section .rodata
    .global swarm_corpus_start
    .global swarm_corpus_end
    .balign 16
swarm_corpus_start:
    .incbin CORPUS_PATH
swarm_corpus_end:
    .byte 0
    .section .note.GNU-stack,"",@progbits
