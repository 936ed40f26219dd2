/* Column-wise decoding of stored event encodings for the Spark reader.
 *
 * The compiled twin of the numpy decoder in _decode.py: it accepts exactly
 * the same shapes (the canonical event with every head in its shortest
 * form, no writer list, byte strings under 4 GiB) and returns None for
 * anything else, so that the caller falls back to the event-by-event path
 * that names the exact error. Every read is bounds-checked against the
 * encoding it belongs to.
 *
 * SHA-256 comes from the libcrypto that Python's hashlib uses, looked up at
 * import; without it the module does not import and the numpy decoder runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef int (*sha_init_fn)(void *);
typedef int (*sha_update_fn)(void *, const void *, size_t);
typedef int (*sha_final_fn)(unsigned char *, void *);

static sha_init_fn sha_init;
static sha_update_fn sha_update;
static sha_final_fn sha_final;

/* OpenSSL's SHA256_CTX is 112 bytes; leave room and keep it aligned. */
typedef union {
    unsigned char bytes[256];
    uint64_t align;
} sha_ctx;

#define OFFSETS_MAX 0x7fffffffLL
#define TOP_BIT (1ULL << 63)

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} cursor;

/* A CBOR head of `major` in its shortest form; for byte strings (major 2)
 * the argument must stay under 2**32, for integers (major 0) under 2**63. */
static int
read_head(cursor *c, int major, uint64_t *value)
{
    if (c->p >= c->end) {
        return 0;
    }
    int info = (int)c->p[0] - (major << 5);
    const unsigned char *q = c->p + 1;
    uint64_t v;
    if (info >= 0 && info < 24) {
        *value = (uint64_t)info;
        c->p = q;
        return 1;
    }
    int width;
    switch (info) {
    case 24: width = 1; break;
    case 25: width = 2; break;
    case 26: width = 4; break;
    case 27: width = (major == 0) ? 8 : 0; break;
    default: width = 0;
    }
    if (width == 0 || c->end - q < width) {
        return 0;
    }
    v = 0;
    for (int i = 0; i < width; i++) {
        v = (v << 8) | q[i];
    }
    switch (width) {
    case 1: if (v < 24) return 0; break;
    case 2: if (v < 0x100) return 0; break;
    case 4: if (v < 0x10000) return 0; break;
    default: if (v < 0x100000000ULL || v >= TOP_BIT) return 0;
    }
    *value = v;
    c->p = q + width;
    return 1;
}

/* A 32-byte string: the head 0x58 0x20 and its bytes. */
static const unsigned char *
read_key(cursor *c)
{
    if (c->end - c->p < 34 || c->p[0] != 0x58 || c->p[1] != 0x20) {
        return NULL;
    }
    const unsigned char *at = c->p + 2;
    c->p += 34;
    return at;
}

static int
is_null(cursor *c)
{
    if (c->p < c->end && c->p[0] == 0xF6) {
        c->p += 1;
        return 1;
    }
    return 0;
}

static int
read_bytes(cursor *c, const unsigned char **at, uint64_t *length)
{
    if (!read_head(c, 2, length) || (uint64_t)(c->end - c->p) < *length) {
        return 0;
    }
    *at = c->p;
    c->p += *length;
    return 1;
}

static PyObject *
new_bytes(Py_ssize_t size, char **data)
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out != NULL) {
        *data = PyBytes_AS_STRING(out);
    }
    return out;
}

enum { SEQS, PREV, PREV_NULL, AUTHOR, COMMAND, COMMAND_NULL, TIME,
       CLOCK_OFFSETS, CLOCK_DATA, PAYLOAD_OFFSETS, PAYLOAD_DATA, DIGESTS, N_OUT };

PyDoc_STRVAR(decode_doc,
"decode(raws, criterion, max_size) -> tuple | None\n\n"
"Decode a list of event encodings (bytes) column-wise. ``criterion`` (32\n"
"bytes or None) is the key every event must carry. Returns the columns as bytes\n"
"(seqs i64, prev 32n, prev_null u8, author 32n, command i64, command_null u8,\n"
"time u64, clock offsets i32 and data, payload offsets i32 and data, SHA-256\n"
"digests 32n), or None if any encoding is not in the common canonical shape.");

static PyObject *
decode(PyObject *self, PyObject *args)
{
    PyObject *raws;
    PyObject *criterion_obj;
    Py_ssize_t max_size;
    if (!PyArg_ParseTuple(args, "O!On", &PyList_Type, &raws, &criterion_obj, &max_size)) {
        return NULL;
    }
    const unsigned char *criterion = NULL;
    if (criterion_obj != Py_None) {
        if (!PyBytes_Check(criterion_obj) || PyBytes_GET_SIZE(criterion_obj) != 32) {
            PyErr_SetString(PyExc_TypeError, "criterion must be 32 bytes or None");
            return NULL;
        }
        criterion = (const unsigned char *)PyBytes_AS_STRING(criterion_obj);
    }
    Py_ssize_t n = PyList_GET_SIZE(raws);
    long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        if (!PyBytes_Check(raw)) {
            PyErr_SetString(PyExc_TypeError, "raws must be a list of bytes");
            return NULL;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(raw);
        if (size > max_size) {
            Py_RETURN_NONE;
        }
        total += size;
    }
    if (n == 0 || total > OFFSETS_MAX) {
        Py_RETURN_NONE;
    }

    PyObject *out[N_OUT] = {NULL};
    char *buf[N_OUT];
    const Py_ssize_t sizes[N_OUT] = {
        8 * n, 32 * n, n, 32 * n, 8 * n, n, 8 * n,
        4 * (n + 1), (Py_ssize_t)total, 4 * (n + 1), (Py_ssize_t)total, 32 * n,
    };
    for (int k = 0; k < N_OUT; k++) {
        if ((out[k] = new_bytes(sizes[k], &buf[k])) == NULL) {
            goto fail;
        }
    }
    int64_t *seqs = (int64_t *)buf[SEQS];
    int64_t *command = (int64_t *)buf[COMMAND];
    uint64_t *time = (uint64_t *)buf[TIME];
    int32_t *clock_offsets = (int32_t *)buf[CLOCK_OFFSETS];
    int32_t *payload_offsets = (int32_t *)buf[PAYLOAD_OFFSETS];
    int32_t clock_used = 0;
    int32_t payload_used = 0;
    clock_offsets[0] = 0;
    payload_offsets[0] = 0;

    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *raw = PyList_GET_ITEM(raws, i);
        const unsigned char *start = (const unsigned char *)PyBytes_AS_STRING(raw);
        cursor c = {start, start + PyBytes_GET_SIZE(raw)};
        uint64_t value, length;
        const unsigned char *at;

        if (c.end - c.p < 40 || c.p[0] != 0x8B || c.p[1] != 0x01) {
            goto shape;
        }
        c.p += 2;
        if ((at = read_key(&c)) == NULL) {
            goto shape;
        }
        if (criterion != NULL && memcmp(at, criterion, 32) != 0) {
            goto shape;
        }
        if (!read_head(&c, 0, &value)) {
            goto shape;
        }
        seqs[i] = (int64_t)value;
        if (is_null(&c)) {
            if (value != 0) {
                goto shape;
            }
            buf[PREV_NULL][i] = 1;
            memset(buf[PREV] + 32 * i, 0, 32);
        } else {
            if (value == 0 || (at = read_key(&c)) == NULL) {
                goto shape;
            }
            buf[PREV_NULL][i] = 0;
            memcpy(buf[PREV] + 32 * i, at, 32);
        }
        if ((at = read_key(&c)) == NULL) {
            goto shape;
        }
        memcpy(buf[AUTHOR] + 32 * i, at, 32);
        if (is_null(&c)) {
            buf[COMMAND_NULL][i] = 1;
            command[i] = 0;
        } else {
            if (!read_head(&c, 0, &value)) {
                goto shape;
            }
            buf[COMMAND_NULL][i] = 0;
            command[i] = (int64_t)value;
        }
        if (!read_bytes(&c, &at, &length)) {
            goto shape;
        }
        memcpy(buf[CLOCK_DATA] + clock_used, at, length);
        clock_used += (int32_t)length;
        clock_offsets[i + 1] = clock_used;
        if (!read_head(&c, 0, &value)) {
            goto shape;
        }
        time[i] = value;
        if (!read_bytes(&c, &at, &length)) {
            goto shape;
        }
        memcpy(buf[PAYLOAD_DATA] + payload_used, at, length);
        payload_used += (int32_t)length;
        payload_offsets[i + 1] = payload_used;
        if (!is_null(&c)) {
            goto shape;
        }
        if (c.end - c.p != 66 || c.p[0] != 0x58 || c.p[1] != 0x40) {
            goto shape;
        }
        sha_ctx ctx;
        if (!sha_init(&ctx) || !sha_update(&ctx, start, (size_t)(c.end - start))
                || !sha_final((unsigned char *)buf[DIGESTS] + 32 * i, &ctx)) {
            PyErr_SetString(PyExc_RuntimeError, "libcrypto SHA-256 failed");
            goto fail;
        }
    }
    if (_PyBytes_Resize(&out[CLOCK_DATA], clock_used) < 0
            || _PyBytes_Resize(&out[PAYLOAD_DATA], payload_used) < 0) {
        goto fail;
    }
    PyObject *result = PyTuple_New(N_OUT);
    if (result == NULL) {
        goto fail;
    }
    for (int k = 0; k < N_OUT; k++) {
        PyTuple_SET_ITEM(result, k, out[k]);
    }
    return result;

shape:
    for (int k = 0; k < N_OUT; k++) {
        Py_XDECREF(out[k]);
    }
    Py_RETURN_NONE;
fail:
    for (int k = 0; k < N_OUT; k++) {
        Py_XDECREF(out[k]);
    }
    return NULL;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cdecode",
    "Compiled column-wise decoding of stored events (see _decode.py).", -1, methods,
};

static int
find_sha256(void)
{
    static const char *names[] = {"libcrypto.so.3", "libcrypto.so", "libcrypto.dylib", NULL};
    for (int i = 0; names[i] != NULL; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            continue;
        }
        sha_init = (sha_init_fn)dlsym(lib, "SHA256_Init");
        sha_update = (sha_update_fn)dlsym(lib, "SHA256_Update");
        sha_final = (sha_final_fn)dlsym(lib, "SHA256_Final");
        if (sha_init && sha_update && sha_final) {
            return 1;
        }
        dlclose(lib);
    }
    return 0;
}

PyMODINIT_FUNC
PyInit__cdecode(void)
{
    if (!find_sha256()) {
        PyErr_SetString(PyExc_ImportError, "libcrypto's SHA-256 not found");
        return NULL;
    }
    return PyModule_Create(&module);
}
