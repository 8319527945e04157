build-dev/obj/node/model.o: node/model.c node/node.h blas/blas.h
node/node.h:
blas/blas.h:
