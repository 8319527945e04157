build-dev/obj/node/daemon.o: node/daemon.c net/net.h node/node.h \
 blas/blas.h
net/net.h:
node/node.h:
blas/blas.h:
