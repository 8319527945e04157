build-dev/obj/node/trainer.o: node/trainer.c node/node.h blas/blas.h \
 swarm/swarm.h
node/node.h:
blas/blas.h:
swarm/swarm.h:
