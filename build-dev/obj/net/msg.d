build-dev/obj/net/msg.o: net/msg.c net/wire.h net/net.h
net/wire.h:
net/net.h:
