build-dev/obj/node/cmd_keygen.o: node/cmd_keygen.c net/net.h
net/net.h:
