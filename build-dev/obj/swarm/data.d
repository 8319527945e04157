build-dev/obj/swarm/data.o: swarm/data.c swarm/swarm.h
swarm/swarm.h:
