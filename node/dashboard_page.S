/* dashboard_page.S - the page of swarm status --serve (node/dashboard.html),
 * built into the binary: the dashboard needs no file beside it. */
    .section .rodata
    .global swarm_dashboard_start
    .global swarm_dashboard_end
    .balign 16
swarm_dashboard_start:
    .incbin DASHBOARD_PATH
swarm_dashboard_end:
    .byte 0
    .section .note.GNU-stack,"",@progbits
