build-dev/obj/node/stage.o: node/stage.c node/node.h blas/blas.h
node/node.h:
blas/blas.h:
