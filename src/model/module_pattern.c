/*
 * module_pattern.c - the exclusion patterns of quantization configs (ModelOpt exclude_modules,
 * compressed-tensors ignore), matched against module names by a small matcher of our own.
 *
 * Two forms, as the exporters and vLLM read them:
 *   "re:" + a regular expression, matched with Python's re.match (anchored at the start only):
 *          literals, ., [...] / [^...] with ranges, \d \w \s \D \W \S and escaped punctuation,
 *          ( ) (?: ) (?P<name> ), |, * + ? {n} {n,} {n,m} (a trailing ? for laziness is accepted
 *          and changes nothing for a yes/no match), ^ $ \A \Z;
 *   anything else: fnmatch wildcards, matched against the whole name (Python's fnmatch): * ? [seq]
 *          [!seq].
 * Anything else (look-around, back-references, \b, flags) is refused at compile time with a message.
 *
 * Why not regcomp: glibc's regcomp expands each repetition into copies, so a 40-byte pattern such as
 * "a" followed by thirty '+' grows past any memory, and its matcher backtracks. Here a pattern
 * compiles to at most MAX_INSTS instructions (a pattern needing more is refused) and runs as a
 * Thompson/Pike simulation: every instruction is visited at most once per character of the name,
 * so a match costs O(instructions x name length), with its scratch on the stack.
 */
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PATTERN 1024   /* bytes of one pattern: real ones are under 200 */
#define MAX_INSTS 2048     /* instructions of one compiled pattern */
#define MAX_REPEAT 256     /* the largest count of {n,m} */

typedef struct { uint8_t bits[32]; } charset;

static void set_add(charset *s, unsigned c) { s->bits[c >> 3] |= (uint8_t)(1u << (c & 7)); }
static bool set_has(const charset *s, unsigned c) { return s->bits[c >> 3] >> (c & 7) & 1u; }
static void set_range(charset *s, unsigned lo, unsigned hi) {
    for (unsigned c = lo; c <= hi; c++) set_add(s, c);
}
static void set_invert(charset *s) {
    for (int i = 0; i < 32; i++) s->bits[i] = (uint8_t)~s->bits[i];
}
static void set_union(charset *s, const charset *o) {
    for (int i = 0; i < 32; i++) s->bits[i] |= o->bits[i];
}

// ---- syntax tree ----

typedef enum { N_SET, N_EMPTY, N_CAT, N_ALT, N_REPEAT, N_BOL, N_EOL, N_END } node_kind;

typedef struct {
    node_kind kind;
    int a, b;             /* children (CAT, ALT: both; REPEAT: a) */
    int min, max;         /* REPEAT: max -1 = unbounded */
    int set;              /* SET: index into the set table */
} node;

typedef struct {
    const char *pat;      /* the pattern without its "re:" */
    size_t pos, len;
    node *nodes;
    int nnodes, cap;
    charset *sets;
    int nsets;
    const char *error;    /* first syntax error */
    size_t error_at;
} parser;

static int new_node(parser *p, node n) {
    if (p->nnodes == p->cap) {   // at most a few nodes per pattern byte: cap is sized for that
        p->error = p->error ? p->error : "too complex";
        p->error_at = p->pos;
        return 0;
    }
    p->nodes[p->nnodes] = n;
    return p->nnodes++;
}

static int set_node(parser *p, const charset *s) {
    if (p->nsets == p->cap) {
        p->error = p->error ? p->error : "too complex";
        return 0;
    }
    p->sets[p->nsets] = *s;
    return new_node(p, (node){.kind = N_SET, .set = p->nsets++});
}

static void fail(parser *p, const char *what) {
    if (!p->error) p->error = what, p->error_at = p->pos;
}

/* The class a backslash escape stands for (\d \w \s and their complements); false if none. */
static bool class_escape(char c, charset *s) {
    memset(s, 0, sizeof *s);
    switch (c) {
    case 'd': case 'D': set_range(s, '0', '9'); break;
    case 'w': case 'W': set_range(s, '0', '9'), set_range(s, 'a', 'z'), set_range(s, 'A', 'Z'), set_add(s, '_'); break;
    case 's': case 'S': set_add(s, ' '), set_range(s, '\t', '\r'); break;
    default: return false;
    }
    if (c == 'D' || c == 'W' || c == 'S') set_invert(s);
    return true;
}

/* A literal escape (\. \\ \n ...): the byte, or -1 for escapes this matcher does not read. */
static int literal_escape(char c) {
    if (c == 'n') return '\n';
    if (c == 't') return '\t';
    if (c == 'r') return '\r';
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '\0') return -1;
    return (unsigned char)c;
}

/* [...] after the '[': ranges, escapes, a leading ^ (regex) or ! (glob) negates. */
static int parse_class(parser *p, bool glob) {
    charset s = {{0}};
    bool neg = false;
    if (p->pos < p->len && p->pat[p->pos] == (glob ? '!' : '^')) neg = true, p->pos++;
    bool first = true;
    while (p->pos < p->len && (p->pat[p->pos] != ']' || first)) {
        first = false;
        int lo = (unsigned char)p->pat[p->pos++];
        if (!glob && lo == '\\') {
            char e = p->pos < p->len ? p->pat[p->pos++] : '\0';
            charset cls;
            if (class_escape(e, &cls)) {
                set_union(&s, &cls);
                continue;
            }
            if ((lo = literal_escape(e)) < 0) {
                fail(p, "an escape this matcher does not read");
                return 0;
            }
        }
        int hi = lo;
        if (p->pos + 1 < p->len && p->pat[p->pos] == '-' && p->pat[p->pos + 1] != ']') {
            p->pos++;
            hi = (unsigned char)p->pat[p->pos++];
            if (!glob && hi == '\\') {
                hi = p->pos < p->len ? literal_escape(p->pat[p->pos++]) : -1;
                if (hi < 0) {
                    fail(p, "an escape this matcher does not read");
                    return 0;
                }
            }
            if (hi < lo) {
                fail(p, "a bad character range");
                return 0;
            }
        }
        set_range(&s, (unsigned)lo, (unsigned)hi);
    }
    if (p->pos >= p->len) {
        fail(p, "an unterminated [");
        return 0;
    }
    p->pos++;   // ']'
    if (neg) set_invert(&s);
    return set_node(p, &s);
}

static int parse_alt(parser *p, int depth);

/* One atom of a regular expression, or -1 at the end of a concatenation. */
static int parse_atom(parser *p, int depth) {
    char c = p->pat[p->pos];
    if (c == '|' || c == ')') return -1;
    p->pos++;
    charset s = {{0}};
    switch (c) {
    case '(': {
        if (p->pos < p->len && p->pat[p->pos] == '?') {
            if (p->pos + 1 < p->len && p->pat[p->pos + 1] == ':') {
                p->pos += 2;
            } else if (p->pos + 2 < p->len && p->pat[p->pos + 1] == 'P' && p->pat[p->pos + 2] == '<') {
                const char *end = memchr(p->pat + p->pos, '>', p->len - p->pos);
                if (!end) {
                    fail(p, "an unterminated group name");
                    return 0;
                }
                p->pos = (size_t)(end - p->pat) + 1;
            } else {
                fail(p, "a (? group this matcher does not read (look-around, flags)");
                return 0;
            }
        }
        if (depth > 64) {
            fail(p, "groups nested too deep");
            return 0;
        }
        int inner = parse_alt(p, depth + 1);
        if (p->pos >= p->len || p->pat[p->pos] != ')') {
            fail(p, "an unterminated (");
            return 0;
        }
        p->pos++;
        return inner;
    }
    case '[': return parse_class(p, false);
    case '.':
        set_range(&s, 0, 255);
        s.bits['\n' >> 3] &= (uint8_t)~(1u << ('\n' & 7));
        return set_node(p, &s);
    case '^': return new_node(p, (node){.kind = N_BOL});
    case '$': return new_node(p, (node){.kind = N_EOL});
    case '*': case '+': case '?': case '{':
        fail(p, "a repetition with nothing to repeat");
        return 0;
    case '\\': {
        char e = p->pos < p->len ? p->pat[p->pos++] : '\0';
        if (e == 'A') return new_node(p, (node){.kind = N_BOL});
        if (e == 'Z') return new_node(p, (node){.kind = N_END});
        if (class_escape(e, &s)) return set_node(p, &s);
        int lit = literal_escape(e);
        if (lit < 0) {
            fail(p, "an escape this matcher does not read (\\b, back-references, ...)");
            return 0;
        }
        set_add(&s, (unsigned)lit);
        return set_node(p, &s);
    }
    default:
        set_add(&s, (unsigned char)c);
        return set_node(p, &s);
    }
}

/* A whole number of {n,m}, at most MAX_REPEAT; -1 if there is none. */
static int parse_count(parser *p) {
    int n = -1;
    while (p->pos < p->len && p->pat[p->pos] >= '0' && p->pat[p->pos] <= '9') {
        n = (n < 0 ? 0 : n) * 10 + (p->pat[p->pos++] - '0');
        if (n > MAX_REPEAT) {
            fail(p, "a repetition count above 256");
            return -1;
        }
    }
    return n;
}

/* Quantifiers after an atom. */
static int parse_repeat(parser *p, int atom) {
    bool repeated = false;
    while (p->pos < p->len && !p->error) {
        char c = p->pat[p->pos];
        int min, max;
        if (c == '*') min = 0, max = -1;
        else if (c == '+') min = 1, max = -1;
        else if (c == '?') min = 0, max = 1;
        else if (c == '{') {
            size_t at = p->pos++;
            min = parse_count(p);
            if (min < 0 && p->pos + 1 < p->len && p->pat[p->pos] == ',' && p->pat[p->pos + 1] != '}') min = 0;
            max = min;
            if (p->pos < p->len && p->pat[p->pos] == ',') p->pos++, max = parse_count(p);
            if (p->error) return atom;
            if (min < 0 || p->pos >= p->len || p->pat[p->pos] != '}' || (max >= 0 && max < min)) {
                // Python reads a "{" that starts no valid repetition as a literal; so does this.
                p->pos = at + 1;
                charset s = {{0}};
                set_add(&s, '{');
                int lit = set_node(p, &s);
                return new_node(p, (node){.kind = N_CAT, .a = atom, .b = lit});
            }
        } else {
            break;
        }
        if (repeated) {
            fail(p, "a repetition of a repetition (Python: multiple repeat)");
            return atom;
        }
        p->pos++;
        if (p->pos < p->len && p->pat[p->pos] == '?') p->pos++;   // lazy: the same yes/no answer
        atom = new_node(p, (node){.kind = N_REPEAT, .a = atom, .min = min, .max = max});
        repeated = true;
    }
    return atom;
}

static int parse_alt(parser *p, int depth) {
    int left = -1;
    for (;;) {
        int cat = -1;
        while (p->pos < p->len && !p->error) {
            int atom = parse_atom(p, depth);
            if (atom < 0) break;
            atom = parse_repeat(p, atom);
            cat = cat < 0 ? atom : new_node(p, (node){.kind = N_CAT, .a = cat, .b = atom});
        }
        if (cat < 0) cat = new_node(p, (node){.kind = N_EMPTY});
        left = left < 0 ? cat : new_node(p, (node){.kind = N_ALT, .a = left, .b = cat});
        if (p->error || p->pos >= p->len || p->pat[p->pos] != '|') return left;
        p->pos++;
    }
}

/* Whether the [ just read starts a class: a ] follows, not counting a first ] (after an optional
 * !), which is a member. Otherwise the [ is a literal, as in Python's fnmatch. */
static bool glob_class_closes(const parser *p) {
    size_t j = p->pos;
    if (j < p->len && p->pat[j] == '!') j++;
    if (j < p->len && p->pat[j] == ']') j++;
    while (j < p->len && p->pat[j] != ']') j++;
    return j < p->len;
}

/* fnmatch wildcards: a concatenation, whole-name match (an [ without its ] is a literal). */
static int parse_glob(parser *p) {
    int cat = new_node(p, (node){.kind = N_EMPTY});
    charset any;
    memset(&any, 0xFF, sizeof any);
    while (p->pos < p->len && !p->error) {
        char c = p->pat[p->pos++];
        int atom;
        if (c == '*') {
            atom = new_node(p, (node){.kind = N_REPEAT, .a = set_node(p, &any), .min = 0, .max = -1});
        } else if (c == '?') {
            atom = set_node(p, &any);
        } else if (c == '[' && glob_class_closes(p)) {
            atom = parse_class(p, true);
        } else {
            charset s = {{0}};
            set_add(&s, (unsigned char)c);
            atom = set_node(p, &s);
        }
        cat = new_node(p, (node){.kind = N_CAT, .a = cat, .b = atom});
    }
    return new_node(p, (node){.kind = N_CAT, .a = cat, .b = new_node(p, (node){.kind = N_END})});
}

// ---- program ----

typedef enum { I_SET, I_SPLIT, I_JMP, I_BOL, I_EOL, I_END, I_MATCH } op;

typedef struct {
    uint8_t op;
    int16_t x, y;         /* SET: set index (x); SPLIT: both targets; JMP: x */
} inst;

struct nvfp4moe_pattern {
    char *text;
    inst *prog;
    int ninst;
    charset *sets;
};

typedef struct {
    const node *nodes;
    inst *prog;
    int n;
    bool overflow;
} emitter;

static int emit(emitter *e, inst in) {
    if (e->n >= MAX_INSTS) {
        e->overflow = true;
        return e->n;
    }
    e->prog[e->n] = in;
    return e->n++;
}

/* Emits node k. Repetitions copy their operand, which is why the program size is bounded. */
static void compile_node(emitter *e, int k) {
    const node *n = &e->nodes[k];
    if (e->overflow) return;
    switch (n->kind) {
    case N_SET: emit(e, (inst){I_SET, (int16_t)n->set, 0}); break;
    case N_EMPTY: break;
    case N_BOL: emit(e, (inst){I_BOL, 0, 0}); break;
    case N_EOL: emit(e, (inst){I_EOL, 0, 0}); break;
    case N_END: emit(e, (inst){I_END, 0, 0}); break;
    case N_CAT:
        compile_node(e, n->a);
        compile_node(e, n->b);
        break;
    case N_ALT: {   // SPLIT L1 L2; L1: a; JMP L3; L2: b; L3:
        int split = emit(e, (inst){I_SPLIT, 0, 0});
        compile_node(e, n->a);
        int jmp = emit(e, (inst){I_JMP, 0, 0});
        int l2 = e->n;
        compile_node(e, n->b);
        if (e->overflow) return;
        e->prog[split].x = (int16_t)(split + 1), e->prog[split].y = (int16_t)l2;
        e->prog[jmp].x = (int16_t)e->n;
        break;
    }
    case N_REPEAT: {
        for (int i = 0; i < n->min; i++) compile_node(e, n->a);
        if (n->max < 0) {   // L1: SPLIT L2 L3; L2: a; JMP L1; L3:
            int split = emit(e, (inst){I_SPLIT, 0, 0});
            compile_node(e, n->a);
            emit(e, (inst){I_JMP, (int16_t)split, 0});
            if (e->overflow) return;
            e->prog[split].x = (int16_t)(split + 1), e->prog[split].y = (int16_t)e->n;
        } else {
            for (int i = n->min; i < n->max; i++) {   // a? repeated max - min times
                int split = emit(e, (inst){I_SPLIT, 0, 0});
                compile_node(e, n->a);
                if (e->overflow) return;
                e->prog[split].x = (int16_t)(split + 1), e->prog[split].y = (int16_t)e->n;
            }
        }
        break;
    }
    }
}

void nvfp4moe_pattern_free(nvfp4moe_pattern *p) {
    if (!p) return;
    free(p->text);
    free(p->prog);
    free(p->sets);
    free(p);
}

nvfp4moe_status nvfp4moe_pattern_compile(const char *pattern, const char *where, nvfp4moe_pattern **out) {
    const size_t n = strlen(pattern);
    NVFP4MOE_RETURN_IF(n > MAX_PATTERN, NVFP4MOE_ERR_FORMAT,
                       "%s: excluded module pattern \"%.60s...\" is %zu bytes long, more than %d", where,
                       pattern, n, MAX_PATTERN);
    const bool re = !strncmp(pattern, "re:", 3);
    parser p = {.pat = re ? pattern + 3 : pattern, .len = re ? n - 3 : n};
    p.cap = 4 * (int)p.len + 8;   // nodes: a few per pattern byte
    p.nodes = malloc(sizeof *p.nodes * (size_t)p.cap);
    p.sets = malloc(sizeof *p.sets * (size_t)p.cap);
    nvfp4moe_pattern *cp = calloc(1, sizeof *cp);
    emitter e = {0};
    if (cp) cp->prog = e.prog = malloc(sizeof *e.prog * MAX_INSTS);
    if (cp) cp->text = strdup(pattern);
    nvfp4moe_status s = NVFP4MOE_OK;
    if (!p.nodes || !p.sets || !cp || !e.prog || !cp->text) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_OUT_OF_MEMORY, "%s: out of memory for pattern \"%s\"", where, pattern);
        goto done;
    }
    int root = re ? parse_alt(&p, 0) : parse_glob(&p);
    if (!p.error && p.pos < p.len) fail(&p, "an unmatched )");
    if (p.error) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                               "%s: excluded module pattern \"%s\": %s at byte %zu (nvfp4moe reads fnmatch "
                               "wildcards and, after re:, a regular expression without look-around or "
                               "back-references)",
                               where, pattern, p.error, p.error_at + (re ? 3 : 0));
        goto done;
    }
    e.nodes = p.nodes;
    compile_node(&e, root);
    emit(&e, (inst){I_MATCH, 0, 0});
    if (e.overflow) {
        s = nvfp4moe_set_error(NVFP4MOE_ERR_FORMAT,
                               "%s: excluded module pattern \"%s\" is too complex (more than %d steps once "
                               "its repetitions are expanded)",
                               where, pattern, MAX_INSTS);
        goto done;
    }
    cp->ninst = e.n;
    cp->sets = p.sets;
    p.sets = NULL;
done:
    free(p.nodes);
    free(p.sets);
    if (s != NVFP4MOE_OK) {
        nvfp4moe_pattern_free(cp);
        return s;
    }
    *out = cp;
    return NVFP4MOE_OK;
}

const char *nvfp4moe_pattern_text(const nvfp4moe_pattern *p) { return p->text; }

// ---- matching ----

typedef struct {
    uint16_t list[MAX_INSTS];
    int n;
} thread_list;

/* Adds pc and every instruction it reaches without reading a character, at position pos of a name
 * of len bytes; true when MATCH is reached. mark[pc] == gen: already added in this generation. */
static bool add_thread(const nvfp4moe_pattern *p, thread_list *l, uint32_t *mark, uint32_t gen, uint16_t *stack,
                       int pc, size_t pos, const char *name, size_t len) {
    int top = 0;
    stack[top++] = (uint16_t)pc;
    while (top > 0) {
        int k = stack[--top];
        if (mark[k] == gen) continue;
        mark[k] = gen;
        const inst *in = &p->prog[k];
        switch (in->op) {
        case I_SET: l->list[l->n++] = (uint16_t)k; break;
        case I_MATCH: return true;
        case I_JMP: stack[top++] = (uint16_t)in->x; break;
        case I_SPLIT:
            stack[top++] = (uint16_t)in->y;
            stack[top++] = (uint16_t)in->x;
            break;
        case I_BOL:
            if (pos == 0) stack[top++] = (uint16_t)(k + 1);
            break;
        case I_EOL:   // Python's $: the end, or before a final newline
            if (pos == len || (pos + 1 == len && name[pos] == '\n')) stack[top++] = (uint16_t)(k + 1);
            break;
        case I_END:
            if (pos == len) stack[top++] = (uint16_t)(k + 1);
            break;
        }
    }
    return false;
}

bool nvfp4moe_pattern_match(const nvfp4moe_pattern *p, const char *name) {
    // Each instruction enters a list at most once per generation and the stack holds each at most
    // twice (a SPLIT's two targets), so these bounds hold.
    thread_list a, b;
    uint16_t stack[2 * MAX_INSTS + 1];
    uint32_t mark[MAX_INSTS];
    memset(mark, 0xFF, sizeof(uint32_t) * (size_t)p->ninst);
    const size_t len = strlen(name);
    thread_list *cur = &a, *next = &b;
    cur->n = 0;
    if (add_thread(p, cur, mark, 0, stack, 0, 0, name, len)) return true;
    for (size_t pos = 0; pos < len && cur->n > 0; pos++) {
        next->n = 0;
        const unsigned c = (unsigned char)name[pos];
        for (int i = 0; i < cur->n; i++) {
            const inst *in = &p->prog[cur->list[i]];
            if (set_has(&p->sets[in->x], c) &&
                add_thread(p, next, mark, (uint32_t)pos + 1, stack, cur->list[i] + 1, pos + 1, name, len))
                return true;
        }
        thread_list *t = cur;
        cur = next;
        next = t;
    }
    return false;
}
