build-dev/obj/net/wire.o: net/wire.c net/wire.h net/net.h
net/wire.h:
net/net.h:
