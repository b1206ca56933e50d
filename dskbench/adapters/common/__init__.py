"""adapters/common"""
