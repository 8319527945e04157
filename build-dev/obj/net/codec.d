build-dev/obj/net/codec.o: net/codec.c net/wire.h net/net.h
net/wire.h:
net/net.h:
