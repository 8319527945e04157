/* plot.c - DIR/loss.svg: a run's loss as a standalone SVG 1.1 line plot that
 * a person can read: the loss of every step, the evaluation points (train and
 * val), labelled axes with 1-2-5 ticks, grid, legend and title.
 *
 * It draws and writes one file (atomically, node_file_write); it knows no run,
 * keeps no state between calls and reads nothing back. Non-finite values are
 * skipped, never drawn. Above PLOT_MAX_POINTS steps the curve is drawn as a
 * min/max envelope: each bucket of steps keeps its lowest and highest loss.
 */
#include "node.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLOT_MAX_POINTS 2000 // points of the per-step curve, at most
#define PLOT_MAX_TICKS 8     // intervals between ticks, at most

// the canvas (px): the plot area is [PLOT_LEFT, PLOT_RIGHT] x [PLOT_TOP, PLOT_BOTTOM]
enum {
    PLOT_W = 800, PLOT_H = 500, PLOT_LEFT = 72, PLOT_RIGHT = PLOT_W - 24, PLOT_TOP = 44,
    PLOT_BOTTOM = PLOT_H - 56, PLOT_INSET = 6,
};

#define C_STEP "#8fb8de"      // train loss, per step
#define C_TRAIN "#1f4e9c"     // train loss, evaluation
#define C_VAL "#e4572e"       // val loss, evaluation

typedef struct {
    double lo, hi;            // the axis' range, data units
    double step;              // between ticks, data units
    int decimals;             // of the tick labels
} axis_t;

// ---- evaluation points -----------------------------------------------------

void node_evals_add(node_evals_t *evals, long step, double train, double val)
{
    // a rollback replays steps: what was measured at or after step is replaced
    while (evals->n > 0 && evals->at[evals->n - 1].step >= step)
        evals->n--;
    if (evals->n == evals->cap) {
        evals->cap = evals->cap ? 2 * evals->cap : 16;
        evals->at = realloc(evals->at, (size_t) evals->cap * sizeof *evals->at);
        if (!evals->at)
            abort();
    }
    evals->at[evals->n++] = (node_eval_point_t) { step, train, val };
}

void node_evals_free(node_evals_t *evals)
{
    free(evals->at);
    *evals = (node_evals_t) { NULL, 0, 0 };
}

// ---- axes ------------------------------------------------------------------

// The smallest of 1, 2, 5 times a power of ten that cuts range into at most
// PLOT_MAX_TICKS intervals (range > 0).
static double s_nice_step(double range)
{
    double mag = pow(10.0, floor(log10(range / PLOT_MAX_TICKS)));
    static const double mult[] = { 1, 2, 5 };
    for (int i = 0; i < 3; i++)
        if (range / (mult[i] * mag) <= PLOT_MAX_TICKS + 1e-9)
            return mult[i] * mag;
    return 10 * mag;
}

// Steps are whole numbers: the x axis spans the data (one step: two more,
// around it where it can) and ticks every 1, 2, 5, 10, ... steps.
static axis_t s_axis_x(long lo, long hi)
{
    if (hi <= lo) {
        lo = lo > 0 ? lo - 1 : lo;
        hi = lo + 2;
    }
    double step = s_nice_step((double) (hi - lo));
    return (axis_t) { (double) lo, (double) hi, step < 1 ? 1 : step, 0 };
}

// The y axis spans the data and a twentieth of it above and below (a flat
// curve: a band of a tenth of its value around it); ticks fall inside.
static axis_t s_axis_y(double lo, double hi)
{
    if (hi - lo <= 1e-9 * fmax(1.0, fabs(hi))) {
        double pad = lo != 0 ? 0.1 * fabs(lo) : 1.0;
        lo -= pad;
        hi += pad;
    }
    double room = 0.05 * (hi - lo);
    double step = s_nice_step(hi - lo + 2 * room);
    int decimals = step >= 1 ? 0 : (int) ceil(-log10(step) - 1e-9);
    return (axis_t) { lo - room, hi + room, step, decimals };
}

// The first and last step sit PLOT_INSET px inside the frame, their markers
// whole.
static double s_px(const axis_t *x, double v)
{
    double width = PLOT_RIGHT - PLOT_LEFT - 2 * PLOT_INSET;
    return PLOT_LEFT + PLOT_INSET + width * (v - x->lo) / (x->hi - x->lo);
}

static double s_py(const axis_t *y, double v)
{
    return PLOT_BOTTOM - (PLOT_BOTTOM - PLOT_TOP) * (v - y->lo) / (y->hi - y->lo);
}

// ---- drawing ---------------------------------------------------------------

static void s_escape(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if ((unsigned char) *s >= 0x20 || *s == '\t')
                fputc(*s, f);
        }
    }
}

// Grid lines and tick labels of both axes, the frame and the axis titles.
static void s_draw_axes(FILE *f, const axis_t *x, const axis_t *y)
{
    fputs("<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n", f);
    long x0 = (long) ceil(x->lo / x->step - 1e-9), x1 = (long) floor(x->hi / x->step + 1e-9);
    long y0 = (long) ceil(y->lo / y->step - 1e-9), y1 = (long) floor(y->hi / y->step + 1e-9);
    for (long k = x0; k <= x1; k++)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n",
                s_px(x, k * x->step), PLOT_TOP, s_px(x, k * x->step), PLOT_BOTTOM);
    for (long k = y0; k <= y1; k++)
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n",
                PLOT_LEFT, s_py(y, k * y->step), PLOT_RIGHT, s_py(y, k * y->step));
    fprintf(f, "</g>\n<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
               "fill=\"none\" "
               "stroke=\"#444\"/>\n<g font-size=\"12\" fill=\"#333\">\n",
            PLOT_LEFT, PLOT_TOP, PLOT_RIGHT - PLOT_LEFT, PLOT_BOTTOM - PLOT_TOP);
    for (long k = x0; k <= x1; k++)
        fprintf(f, "<text class=\"xtick\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%ld</text>\n",
                s_px(x, k * x->step), PLOT_BOTTOM + 18, (long) llround(k * x->step));
    for (long k = y0; k <= y1; k++) {
        double v = fabs(k * y->step) < 1e-6 * y->step ? 0.0 : k * y->step;
        fprintf(f, "<text class=\"ytick\" x=\"%d\" y=\"%.1f\" dy=\"0.35em\" text-anchor=\"end\">"
                   "%.*f</text>\n", PLOT_LEFT - 8, s_py(y, v), y->decimals, v);
    }
    fprintf(f, "</g>\n<g font-size=\"14\" fill=\"#222\">\n"
               "<text class=\"xtitle\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n"
               "<text class=\"ytitle\" x=\"18\" y=\"%d\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 18 %d)\">loss</text>\n</g>\n",
            (PLOT_LEFT + PLOT_RIGHT) / 2, PLOT_H - 14, (PLOT_TOP + PLOT_BOTTOM) / 2,
            (PLOT_TOP + PLOT_BOTTOM) / 2);
}

static void s_point(FILE *f, const axis_t *x, const axis_t *y, double step, double loss)
{
    fprintf(f, "%.1f,%.1f ", s_px(x, step), s_py(y, loss));
}

// The per-step curve: every finite step, or above PLOT_MAX_POINTS steps the
// lowest and highest loss of each of PLOT_MAX_POINTS / 2 buckets, in step order.
static void s_draw_steps(FILE *f, const node_plot_t *p, const axis_t *x, const axis_t *y)
{
    fprintf(f, "<polyline class=\"train\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.2\" "
               "stroke-linejoin=\"round\" points=\"", C_STEP);
    long buckets = PLOT_MAX_POINTS / 2;
    long bucket = p->count <= PLOT_MAX_POINTS ? 1 : (p->count + buckets - 1) / buckets;
    long finite = 0, only = 0;
    for (long b = 0; b < p->count; b += bucket) {
        long lo = -1, hi = -1;
        for (long k = b; k < b + bucket && k < p->count; k++) {
            if (!isfinite(p->loss[k]))
                continue;
            lo = lo < 0 || p->loss[k] < p->loss[lo] ? k : lo;
            hi = hi < 0 || p->loss[k] > p->loss[hi] ? k : hi;
        }
        if (lo < 0)
            continue;
        long a = lo < hi ? lo : hi, z = lo < hi ? hi : lo;
        s_point(f, x, y, (double) (p->first + a), p->loss[a]);
        if (z != a)
            s_point(f, x, y, (double) (p->first + z), p->loss[z]);
        finite++;
        only = a;
    }
    fputs("\"/>\n", f);
    if (finite == 1 && bucket == 1) // one step: a polyline of one point shows nothing
        fprintf(f, "<circle class=\"train\" cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                s_px(x, (double) (p->first + only)), s_py(y, p->loss[only]), C_STEP);
}

// One split's evaluation points (which 0 train, 1 val): joined, then marked;
// val dashed and hollow, drawn last, so that train shows where they meet.
static void s_draw_evals(FILE *f, const node_plot_t *p, const axis_t *x, const axis_t *y, int which)
{
    const char *cls = which ? "eval-val" : "eval-train", *color = which ? C_VAL : C_TRAIN;
    fprintf(f, "<polyline class=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" "
               "stroke-linejoin=\"round\"%s points=\"", cls, color,
            which ? " stroke-dasharray=\"6 3\"" : "");
    for (long i = 0; i < p->nevals; i++) {
        double v = which ? p->evals[i].val : p->evals[i].train;
        if (isfinite(v))
            s_point(f, x, y, (double) p->evals[i].step, v);
    }
    fputs("\"/>\n", f);
    for (long i = 0; i < p->nevals; i++) {
        double v = which ? p->evals[i].val : p->evals[i].train;
        if (isfinite(v))
            fprintf(f, "<circle class=\"%s\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" "
                       "stroke=\"%s\" stroke-width=\"1.5\"/>\n", cls,
                    s_px(x, (double) p->evals[i].step), s_py(y, v), which ? "white" : color,
                    which ? color : "white");
    }
}

// A box in the top right corner (where a falling curve is not) naming each
// curve drawn.
static void s_draw_legend(FILE *f, int steps, int evals)
{
    static const char *name[] = {
        "train loss, every step", "train loss, evaluated", "val loss, evaluated",
    };
    static const char *color[] = { C_STEP, C_TRAIN, C_VAL };
    int from = steps ? 0 : 1, to = evals ? 3 : 1, w = 190, x = PLOT_RIGHT - 10 - w;
    int y = PLOT_TOP + 10;
    fprintf(f, "<g font-size=\"12\" fill=\"#222\">\n<rect x=\"%d\" y=\"%d\" width=\"%d\" "
               "height=\"%d\" fill=\"white\" fill-opacity=\"0.9\" stroke=\"#bbb\"/>\n",
            x, y, w, 8 + 18 * (to - from));
    for (int i = from; i < to; i++) {
        int cy = y + 13 + 18 * (i - from);
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                   "stroke-width=\"%s\"%s/>\n", x + 8, cy, x + 32, cy, color[i], i ? "2" : "1.2",
                i == 2 ? " stroke-dasharray=\"6 3\"" : "");
        if (i)
            fprintf(f, "<circle cx=\"%d\" cy=\"%d\" r=\"3.5\" fill=\"%s\" stroke=\"%s\" "
                       "stroke-width=\"1.5\"/>\n", x + 20, cy, i == 2 ? "white" : color[i],
                    color[i]);
        fprintf(f, "<text class=\"legend\" x=\"%d\" y=\"%d\" dy=\"0.35em\">%s</text>\n", x + 40, cy,
                name[i]);
    }
    fputs("</g>\n", f);
}

typedef struct {
    long x_lo, x_hi;          // steps
    double y_lo, y_hi;        // loss
    int any;                  // a finite value was seen
} extent_t;

// Widen e to (step, v); 1 when v is finite (drawn), 0 when it is skipped.
static int s_grow(extent_t *e, long step, double v)
{
    if (!isfinite(v))
        return 0;
    if (!e->any)
        *e = (extent_t) { step, step, v, v, 1 };
    e->x_lo = step < e->x_lo ? step : e->x_lo;
    e->x_hi = step > e->x_hi ? step : e->x_hi;
    e->y_lo = fmin(e->y_lo, v);
    e->y_hi = fmax(e->y_hi, v);
    return 1;
}

// The range of every finite value drawn; *steps: a step loss is drawn,
// *evals: an evaluation is.
static extent_t s_extent(const node_plot_t *p, int *steps, int *evals)
{
    extent_t e = { 0, 0, 0, 0, 0 };
    *steps = *evals = 0;
    for (long k = 0; k < p->count; k++)
        *steps |= s_grow(&e, p->first + k, p->loss[k]);
    for (long i = 0; i < p->nevals; i++) {
        *evals |= s_grow(&e, p->evals[i].step, p->evals[i].train);
        *evals |= s_grow(&e, p->evals[i].step, p->evals[i].val);
    }
    return e;
}

// ---- the file --------------------------------------------------------------

int node_plot_write(const char *path, const node_plot_t *plot, char *err, size_t errlen)
{
    int steps, evals;
    extent_t e = s_extent(plot, &steps, &evals);
    if (!e.any) {
        snprintf(err, errlen, "%s: no finite loss to plot", path);
        return -EINVAL;
    }
    axis_t x = s_axis_x(e.x_lo, e.x_hi), y = s_axis_y(e.y_lo, e.y_hi);
    char *svg = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&svg, &size);
    if (!f)
        abort(); // a few hundred kB at most: bookkeeping
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
               "height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
               "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n"
               "<text class=\"title\" x=\"%d\" y=\"26\" text-anchor=\"middle\" font-size=\"16\" "
               "fill=\"#111\">", PLOT_W, PLOT_H, PLOT_W, PLOT_H, PLOT_W, PLOT_H, PLOT_W / 2);
    s_escape(f, plot->title ? plot->title : "loss");
    fputs("</text>\n", f);
    s_draw_axes(f, &x, &y);
    if (steps)
        s_draw_steps(f, plot, &x, &y);
    if (evals) {
        s_draw_evals(f, plot, &x, &y, 0);
        s_draw_evals(f, plot, &x, &y, 1);
    }
    s_draw_legend(f, steps, evals);
    fputs("</svg>\n", f);
    int rc = fclose(f) == 0 ? 0 : -ENOMEM;
    if (rc != 0)
        snprintf(err, errlen, "%s: out of memory drawing the plot", path);
    else
        rc = node_file_write(path, svg, size, err, errlen);
    free(svg);
    return rc;
}

void node_plot_save(const char *dir, const char *who, const float *curve, long first,
                    long last, const node_evals_t *evals, int quiet)
{
    char path[4096], title[128], err[4096 + 128];
    snprintf(path, sizeof path, "%s/loss.svg", dir);
    snprintf(title, sizeof title, "%s: loss, steps %ld-%ld", who, first, last - 1);
    node_plot_t plot = { title, curve + first, first, last - first, evals->at, evals->n };
    if (node_plot_write(path, &plot, err, sizeof err) != 0)
        fprintf(stderr, "%s: loss curve not plotted: %s\n", who, err);
    else if (!quiet)
        printf("%s: loss curve plotted in %s\n", who, path);
}
