"""ampe.costmodel"""
