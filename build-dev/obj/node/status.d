build-dev/obj/node/status.o: node/status.c node/node.h blas/blas.h \
 net/net.h
node/node.h:
blas/blas.h:
net/net.h:
