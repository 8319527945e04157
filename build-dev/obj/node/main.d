build-dev/obj/node/main.o: node/main.c node/node.h blas/blas.h
node/node.h:
blas/blas.h:
