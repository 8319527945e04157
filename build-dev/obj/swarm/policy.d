build-dev/obj/swarm/policy.o: swarm/policy.c swarm/swarm.h
swarm/swarm.h:
