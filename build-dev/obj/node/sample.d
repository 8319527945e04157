build-dev/obj/node/sample.o: node/sample.c node/node.h blas/blas.h \
 swarm/swarm.h
node/node.h:
blas/blas.h:
swarm/swarm.h:
