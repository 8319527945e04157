build-dev/obj/net/key.o: net/key.c net/wire.h net/net.h
net/wire.h:
net/net.h:
