#!/usr/bin/env python3
"""Cross-check of fs/crypt with an independent implementation (pyca/cryptography >= 44, on
OpenSSL): XChaCha20-Poly1305 built from its ChaCha20 (HChaCha20 recovered from one block),
checked on draft-irtf-cfrg-xchacha A.3.1 (and RFC 8439 2.8.2), then the two records pinned in tests/wrapped.rs
recomputed from their documented construction. Run: python3 fs/crypt/tests/xcheck.py"""
import struct
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives import hashes

def hchacha20(key, n16):
    # ChaCha20 block with words 12..15 = n16: keystream = rounds(state) + state.
    ks = Cipher(algorithms.ChaCha20(key, n16), mode=None).encryptor().update(b"\0" * 64)
    w = struct.unpack("<16I", ks)
    c = struct.unpack("<4I", b"expand 32-byte k")
    n = struct.unpack("<4I", n16)
    out = [(w[i] - c[i]) & 0xffffffff for i in range(4)] + [(w[12 + i] - n[i]) & 0xffffffff for i in range(4)]
    return struct.pack("<8I", *out)

def xseal(key, nonce24, aad, pt):
    sub = hchacha20(key, nonce24[:16])
    return ChaCha20Poly1305(sub).encrypt(b"\0\0\0\0" + nonce24[16:], pt, aad)

# draft-irtf-cfrg-xchacha A.3.1 first, so the construction itself is right.
k = bytes(range(0x80, 0xa0)); n = bytes(range(0x40, 0x58))
aad = bytes.fromhex("50515253c0c1c2c3c4c5c6c7")
pt = b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it."
ct = xseal(k, n, aad, pt)
assert ct[-16:].hex() == "c0875924c1c7987947deafd8780acf49", ct[-16:].hex()
print("xchacha A.3.1 ok")
# RFC 8439 2.8.2 (the same key, AAD and plaintext; a 96-bit nonce).
ct = ChaCha20Poly1305(k).encrypt(bytes.fromhex("070000004041424344454647"), pt, aad)
assert ct[:16].hex() == "d31a8d34648e60db7b86afbc53ef7ec2" and ct[-16:].hex() == "1ae10b594f09e26a7e902ecbd0600691"
print("chacha20poly1305 RFC 8439 2.8.2 ok")

def check(rec_hex, kek_fn):
    rec = bytes.fromhex(rec_hex)
    header, sealed, tag = rec[:60], rec[60:92], rec[92:]
    salt, nonce = header[20:36], header[36:60]
    kek = kek_fn(salt)
    out = xseal(kek, nonce, header, bytes([0x24]) * 32)
    assert out == sealed + tag, "mismatch"

raw = "4e66574b01020000000000000000000000000000df961433e9e54d2868b7de3d22838c45898bb821b04858f16923b841dabf3282ed3a3176de911e18b78c379b78e1800e34729a855a68445efdf4ea6815df315f5a402b3867c8d784d588df5568098a1a3beac60e2b34ed2b"
check(raw, lambda salt: HKDF(hashes.SHA256(), 32, salt, b"ninefold-crypt v1 raw wrapping key").derive(bytes([0x42]) * 32))
print("raw record ok")
arg = "4e66574b0101000000200000010000000100000037fe1f2e53d6c6dec478fb69debbe1d3722421ecdf830660507922e0be08301996990ffcf934a146826fc15b1a7498ff5f29ad572eff08e76c0ee48594a5a2985da70e00fa8e73506fae14137210b4d65d5449149ffcfe45"
from cryptography.hazmat.primitives.kdf.argon2 import Argon2id
check(arg, lambda salt: Argon2id(salt=salt, length=32, iterations=1, lanes=1, memory_cost=8192).derive(b"correct horse battery staple"))
print("argon2id record ok")
# The data subkey: HKDF-SHA256, no salt, info label.
print("subkey(data) of 0x5a*32:", HKDF(hashes.SHA256(), 32, None, b"ninefold-crypt v1 data").derive(bytes([0x5a]) * 32).hex())
