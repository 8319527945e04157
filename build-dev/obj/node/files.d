build-dev/obj/node/files.o: node/files.c node/node.h blas/blas.h
node/node.h:
blas/blas.h:
