build-dev/obj/node/train.o: node/train.c node/node.h blas/blas.h \
 swarm/swarm.h
node/node.h:
blas/blas.h:
swarm/swarm.h:
