build-dev/obj/node/optim.o: node/optim.c node/node.h blas/blas.h
node/node.h:
blas/blas.h:
