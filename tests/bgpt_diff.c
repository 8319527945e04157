/* bgpt_diff.c - tests' weight comparison: bgpt_diff A B TOL reads two BGPT
 * weight files (node_bgpt_read checks each) and prints one line with the
 * largest difference of their weights, absolute and relative to the larger
 * magnitude (at least 1); exit 0 when the shapes are the same and that
 * relative difference is within TOL, 1 when not, 2 when a file is bad.
 */
#include "node.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bgpt_diff A.bgpt B.bgpt TOL\n");
        return 2;
    }
    node_bgpt_header_t ha, hb;
    float *a = NULL, *b = NULL;
    char err[512];
    if (node_bgpt_read(argv[1], &ha, &a, err, sizeof err) != 0
        || node_bgpt_read(argv[2], &hb, &b, err, sizeof err) != 0) {
        fprintf(stderr, "bgpt_diff: %s\n", err);
        return 2;
    }
    size_t n = node_config_params(&ha.cfg);
    if (memcmp(&ha.cfg, &hb.cfg, sizeof ha.cfg) != 0 || n != node_config_params(&hb.cfg)) {
        printf("bgpt_diff: %s and %s are models of different shapes\n", argv[1], argv[2]);
        return 1;
    }
    double most = 0.0, rel = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double) a[i] - b[i]);
        double r = d / fmax(1.0, fmax(fabs(a[i]), fabs(b[i])));
        most = fmax(most, d);
        if (r > rel) {
            rel = r;
            at = i;
        }
    }
    double tol = strtod(argv[3], NULL);
    printf("bgpt_diff: %zu weights, steps %d and %d: largest difference %.3g (relative %.3g, "
           "weight %zu)\n", n, ha.step, hb.step, most, rel, at);
    free(a);
    free(b);
    return rel <= tol && ha.step == hb.step ? 0 : 1;
}
