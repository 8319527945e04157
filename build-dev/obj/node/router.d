build-dev/obj/node/router.o: node/router.c node/node.h blas/blas.h \
 net/net.h swarm/swarm.h
node/node.h:
blas/blas.h:
net/net.h:
swarm/swarm.h:
