build-dev/obj/net/transport.o: net/transport.c net/wire.h net/net.h
net/wire.h:
net/net.h:
