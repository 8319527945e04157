build-dev/obj/node/opts.o: node/opts.c node/node.h blas/blas.h \
 swarm/swarm.h
node/node.h:
blas/blas.h:
swarm/swarm.h:
