#!/usr/bin/env python3
"""rewrite.py: the one source-to-source step of the emulated GPU (dev/emu).

CUDA C++ is C++ except for two pieces of syntax, which this rewrites so that g++ can compile the CUDA
sources against dev/emu/fake_cuda:

  kern<<<grid, block, smem, stream>>>(args)     ->  emu_launch("kern", kern, grid, block, smem, stream)(args)
  foo<4><<<g, b>>>(args)                        ->  emu_launch("foo<4>", foo<4>, g, b)(args)
  __shared__ float a[8][33], b[8][33];          ->  auto& a = *emu_shared<float[8][33]>(<key>, "a", 16); auto& b = ...
  extern __shared__ float4 smem[];              ->  float4* const smem = (float4*)emu_shared_dynamic();

where <key> is the address of a static local of a lambda, unique to the declaration (and to each template
instantiation), so all threads of a block share one variable. Everything else (__global__, threadIdx,
__syncthreads, shuffles, ...) is ordinary C++ against the fake headers.

Usage: rewrite.py SRC_ROOT OUT_DIR. Every C/C++/CUDA source under SRC_ROOT (but .git, build/ and the fake
headers) is copied to OUT_DIR under the same relative path, rewritten where needed, with a #line directive
so that compiler messages, __FILE__ and addr2line name the original file and line. Line numbers are kept:
a rewritten construct spans as many lines as the original. A construct this cannot rewrite is an error
naming the file and line, never a silent miscompile.
"""
import os
import re
import sys

EXTS = ('.cu', '.cuh', '.h', '.hpp', '.inl', '.inc', '.c', '.cc', '.cpp')
SKIP_DIRS = {'.git', 'build', '__pycache__', 'gpucheck_out'}


def code_mask(s):
    """True for characters of code, False inside comments, string and character literals."""
    mask = [True] * len(s)
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if s.startswith('//', i):
            j = s.find('\n', i)
            j = n if j < 0 else j
        elif s.startswith('/*', i):
            j = s.find('*/', i + 2)
            j = n if j < 0 else j + 2
        elif c == 'R' and s.startswith('R"', i) and (i == 0 or not (s[i - 1].isalnum() or s[i - 1] == '_')):
            k = s.find('(', i + 2)
            delim = s[i + 2:k]
            j = s.find(')' + delim + '"', k)
            j = n if j < 0 else j + len(delim) + 2
        elif c in '"\'':
            j = i + 1
            while j < n and s[j] != c:
                j += 2 if s[j] == '\\' else 1
            j += 1
        else:
            i += 1
            continue
        for k in range(i, min(j, n)):
            mask[k] = False
        i = j
    return mask


class RewriteError(Exception):
    pass


def line_of(s, pos):
    return s.count('\n', 0, pos) + 1


def split_top(text, angle=False):
    """Splits at commas outside (), [], {} (and <> if angle)."""
    parts, depth, ang, start = [], 0, 0, 0
    for i, c in enumerate(text):
        if c in '([{':
            depth += 1
        elif c in ')]}':
            depth -= 1
        elif angle and depth == 0 and c == '<':
            ang += 1
        elif angle and depth == 0 and c == '>' and ang > 0:
            ang -= 1
        elif c == ',' and depth == 0 and ang == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def rewrite_launches(s, path):
    out, pos = [], 0
    mask = code_mask(s)
    i = s.find('<<<')
    while i >= 0:
        if not mask[i]:
            i = s.find('<<<', i + 3)
            continue
        # the kernel expression before <<<: name, optional ::qualifiers, optional <template args>
        j = i
        while j > 0 and s[j - 1].isspace():
            j -= 1
        end_name = j
        if j > 0 and s[j - 1] == '>':
            depth = 0
            while j > 0:
                j -= 1
                if s[j] == '>':
                    depth += 1
                elif s[j] == '<':
                    depth -= 1
                    if depth == 0:
                        break
        while j > 0 and (s[j - 1].isalnum() or s[j - 1] in '_:'):
            j -= 1
        name = s[j:end_name]
        if not re.match(r'^[A-Za-z_][\w:]*(<.*>)?$', name, re.S):
            raise RewriteError('%s:%d: cannot find the kernel name before <<<' % (path, line_of(s, i)))
        # the configuration up to the matching >>>
        k, depth = i + 3, 0
        while k < len(s):
            if mask[k]:
                c = s[k]
                if c in '([{':
                    depth += 1
                elif c in ')]}':
                    depth -= 1
                elif depth == 0 and s.startswith('>>>', k):
                    break
            k += 1
        if k >= len(s):
            raise RewriteError('%s:%d: no >>> closes this <<<' % (path, line_of(s, i)))
        cfg = s[i + 3:k]
        nargs = len(split_top(cfg))
        if nargs < 2 or nargs > 4:
            raise RewriteError('%s:%d: a launch configuration has 2 to 4 parts, this has %d' % (path, line_of(s, i), nargs))
        after = k + 3
        while after < len(s) and s[after].isspace():
            after += 1
        if after >= len(s) or s[after] != '(':
            raise RewriteError('%s:%d: expected the kernel arguments after >>>' % (path, line_of(s, i)))
        flat = ' '.join(name.split())
        out.append(s[pos:j])
        out.append('emu_launch("%s", %s, %s)' % (flat.replace('"', '\\"'), name, cfg))
        out.append(s[k + 3:after])
        pos = after
        i = s.find('<<<', after)
    out.append(s[pos:])
    return ''.join(out)


def rewrite_shared(s, path):
    out, pos = [], 0
    mask = code_mask(s)
    for m in re.finditer(r'\b__shared__\b', s):
        i = m.start()
        if not mask[i] or i < pos:
            continue
        # the declaration: back to the previous ; { } (or the start of a line with a preprocessor directive)
        b = i
        while b > 0 and not (mask[b - 1] and s[b - 1] in ';{}'):
            b -= 1
        # not across a preprocessor line (#if ... before the declaration)
        prefix_lines = s[b:i].split('\n')
        if any(l.strip().startswith('#') for l in prefix_lines[:-1]):
            b = i - len(prefix_lines[-1])
        while b < i and s[b].isspace():
            b += 1
        e = s.find(';', i)
        while e >= 0 and not mask[e]:
            e = s.find(';', e + 1)
        if e < 0:
            raise RewriteError('%s:%d: __shared__ declaration without ;' % (path, line_of(s, i)))
        depth = 0
        for k in range(0, b):
            if mask[k] and s[k] == '{':
                depth += 1
            elif mask[k] and s[k] == '}':
                depth -= 1
        if depth <= 0:
            raise RewriteError('%s:%d: a __shared__ variable at file scope is outside the emulated subset' % (path, line_of(s, i)))
        decl = ''.join(c if mask[k] or c == '\n' else ' ' for k, c in enumerate(s[b:e], b))  # comments dropped
        newlines = decl.count('\n')
        text = ' '.join(decl.split())
        if '=' in text:
            raise RewriteError('%s:%d: a __shared__ variable cannot have an initializer' % (path, line_of(s, i)))
        align = 16
        am = re.search(r'\b(?:__align__|alignas)\s*\(\s*(\d+)\s*\)', text)
        if am:
            align = max(align, int(am.group(1)))
            text = text[:am.start()] + text[am.end():]
        words = text.split()
        is_extern = 'extern' in words
        text = ' '.join(w for w in words if w not in ('__shared__', 'extern', 'static'))
        parts = split_top(text, angle=True)
        first = re.match(r'^(.*?)\s*\b([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)$', parts[0], re.S)
        if not first or not first.group(1).strip():
            raise RewriteError('%s:%d: cannot parse this __shared__ declaration' % (path, line_of(s, i)))
        ctype = first.group(1).strip()
        decls = [(first.group(2), first.group(3).strip())]
        for p in parts[1:]:
            d = re.match(r'^\s*([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)$', p)
            if not d:
                raise RewriteError('%s:%d: cannot parse the declarator %r of a __shared__ declaration' % (path, line_of(s, i), p.strip()))
            decls.append((d.group(1), d.group(2).strip()))
        stmts = []
        for name, dims in decls:
            if is_extern:
                if dims.replace(' ', '') != '[]':
                    raise RewriteError('%s:%d: extern __shared__ must be an unsized array' % (path, line_of(s, i)))
                stmts.append('%s* const %s = (%s*)emu_shared_dynamic()' % (ctype, name, ctype))
            else:
                stmts.append('auto& %s = *emu_shared<%s%s>([]() { static char k_; return (const void*)&k_; }(), "%s", %d)'
                             % (name, ctype, dims, name, align))
        out.append(s[pos:b])
        out.append('; '.join(stmts) + '\n' * newlines)
        pos = e
    out.append(s[pos:])
    return ''.join(out)


def rewrite_file(src, dst, rel):
    with open(src, encoding='utf-8', errors='surrogateescape') as f:
        s = f.read()
    t = s
    if '<<<' in t:
        t = rewrite_launches(t, rel)
    if '__shared__' in t:
        t = rewrite_shared(t, rel)
    t = '#line 1 "%s"\n%s' % (rel, t)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    old = None
    if os.path.exists(dst):
        with open(dst, encoding='utf-8', errors='surrogateescape') as f:
            old = f.read()
    if old != t:  # untouched files keep their timestamps
        with open(dst, 'w', encoding='utf-8', errors='surrogateescape') as f:
            f.write(t)


def main():
    if len(sys.argv) != 3:
        sys.exit('usage: rewrite.py SRC_ROOT OUT_DIR')
    root, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    fake = os.path.join(root, 'dev', 'emu', 'fake_cuda')
    try:
        for d, dirs, files in os.walk(root):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and os.path.join(d, x) not in (fake, out))
            for f in sorted(files):
                if f.endswith(EXTS):
                    src = os.path.join(d, f)
                    rel = os.path.relpath(src, root)
                    rewrite_file(src, os.path.join(out, rel), rel)
    except RewriteError as e:
        sys.exit('rewrite.py: %s' % e)


if __name__ == '__main__':
    main()
