build-dev/obj/node/corpus.o: node/corpus.c node/node.h blas/blas.h
node/node.h:
blas/blas.h:
