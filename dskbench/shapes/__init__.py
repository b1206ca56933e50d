"""shapes"""
